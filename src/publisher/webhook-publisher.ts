import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import { excerpt, failedBeforeSending, getJson, postJson, transientStatusFailure } from '../lib/http';
import { FailureType, workflowIdFor } from '../contract';
import { claimantName } from '../lib/claimant';
import { inSpan } from '../telemetry/spans';
import { inFlightMs } from './ledger';
import type { Delivery, DeliveryLedger } from './ledger';
import { signer } from './signature';
import type { Publication, Publisher, Receipt } from './types';

/** What a receiver may answer; revision, duplicate and superseded are optional so any 2xx endpoint works. */
const ReceiptBodySchema = z
  .object({
    revision: z.number().int().min(1).optional(),
    duplicate: z.boolean().optional(),
    superseded: z.boolean().optional(),
    idempotencyKey: z.string().optional(),
  })
  .loose();

/** Claims of one publish call: a claim that moved on while it was looked at is claimed again, this often at most. */
const MAX_ROUNDS = 3;

/**
 * What a lookup must answer to count (docs/recovery.md): the key asked for, and for a delivery the version
 * (textRef) it delivered. Anything else proves nothing.
 */
const LookupBodySchema = z
  .object({
    idempotencyKey: z.string(),
    found: z.boolean().optional(),
    revision: z.number().int().min(1).optional(),
    textRef: z.string().optional(),
  })
  .loose();

/** How long a held delivery waits before it looks at the ledger again (an operator may have resolved it). */
const HELD_RETRY_MS = 30_000;

export interface WebhookOptions {
  url: string;
  timeoutMs: number;
  ledger: DeliveryLedger;
  /** What to do with an earlier attempt's open claim: see Config.openDeliveryPolicy. */
  openClaimPolicy: 'auto' | 'resend' | 'hold';
  /** PUBLISH_WEBHOOK_SECRET: when set, every request is signed with it (Standard Webhooks, id = the key). */
  secret?: string | undefined;
  /**
   * PUBLISH_WEBHOOK_LOOKUP_URL: where the receiver says whether a key took effect, `{key}` standing for the key
   * (e.g. `http://receiver/publications/{key}`, answering 200 or 404). Asked before an open claim is sent again or
   * held, it settles the claim by itself.
   */
  lookupUrl?: string | undefined;
}

/**
 * POSTs the publication as JSON with an `Idempotency-Key` header, signed when a secret is set (Standard Webhooks,
 * the key as webhook-id), recording each delivery in the ledger first: claim, POST, receipt. A retry that finds
 * the receipt answers from it and never POSTs; one that finds the claim open (an attempt died or lost the answer
 * after sending) re-sends only when the receiver dedupes by key, and otherwise holds the delivery for an operator
 * (`npm run deliveries`). 2xx is success; 408, 409 ("key in use"), 429 and 5xx are retried (honouring
 * Retry-After); any other 4xx (401 for a missing or wrong signature) fails without retry and quotes the answer.
 */
export class WebhookPublisher implements Publisher {
  readonly kind = 'webhook';
  private readonly what: string;
  /** The receiver's origin: what it has shown (that it echoes keys) is recorded under it. */
  private readonly origin: string;
  private readonly sign: ReturnType<typeof signer> | undefined;

  constructor(private readonly options: WebhookOptions) {
    // Only the origin: webhook URLs often carry a token in the path, and messages land in histories and logs.
    this.origin = new URL(options.url).origin;
    this.what = `publish webhook at ${this.origin}`;
    this.sign = options.secret === undefined ? undefined : signer(options.secret);
  }

  async publish(publication: Publication, idempotencyKey: string, signal: AbortSignal): Promise<Receipt> {
    const { ledger } = this.options;
    const owner = claimantName();
    const delivery = deliveryOf(publication, idempotencyKey, this.options.timeoutMs);
    // A few rounds at most: a verdict that settles an open claim, or a claim that moved on while it was looked up,
    // sends it back to the ledger to claim again.
    for (let round = 1; ; round++) {
      const claim = await ledger.claim(delivery, owner);
      if (claim.kind === 'fresh') return this.post(publication, idempotencyKey, owner, signal);
      if (claim.kind === 'delivered') return { ...claim.receipt, duplicate: true };
      // An open claim: this key's earlier attempt, or an earlier run's delivery of this same version.
      const seen = claim.entry;
      const open = seen.idempotencyKey;
      const found = await this.lookUp(open, publication, signal);
      if (found !== undefined && found !== 'absent') {
        // The lookup named this key and this version: delivered. Settled only if the claim is still the one seen.
        if (await ledger.resolve(seen, { delivered: found })) {
          if (open !== idempotencyKey) await ledger.deliveredAs(idempotencyKey, found);
          return { ...found, duplicate: true };
        }
        if (round < MAX_ROUNDS) continue;
      }
      // "Not there" is believed only of a POST that cannot still be on its way or still be processed: its last
      // send (or answer) is older, by the store's clock, than the request timeout and a grace. A timeout or a
      // gateway's 504 ends the attempt, not the origin's work on the request.
      const over = seen.ageMs >= delivery.inFlightMs;
      if (found === 'absent' && over && round < MAX_ROUNDS) {
        await ledger.resolve(seen, 'unsent');
        continue;
      }
      if (!(await this.resendOpenClaims())) throw this.held(publication, open, idempotencyKey);
      if (!(await ledger.retake(seen, owner))) {
        if (round < MAX_ROUNDS) continue;
        throw this.held(publication, open, idempotencyKey);
      }
      if (open === idempotencyKey) return this.post(publication, idempotencyKey, owner, signal);
      // Sent again under the earlier run's key: a receiver that dedupes answers it instead of publishing twice.
      const receipt = await this.post(publication, open, owner, signal);
      await ledger.deliveredAs(idempotencyKey, receipt);
      return receipt;
    }
  }

  /** The failure of a delivery held for a person: what is unknown, and the commands that settle it. */
  private held(publication: Publication, open: string, idempotencyKey: string): ApplicationFailure {
    const whose =
      open === idempotencyKey
        ? `an earlier attempt sent publication "${publication.documentId}" (key ${open})`
        : `an earlier run sent this version of "${publication.documentId}" (key ${open}, this run's is ` +
          `${idempotencyKey})`;
    return ApplicationFailure.create({
      type: FailureType.DeliveryHeld,
      message:
        `${whose} to the ${this.what} and never got its answer, and this receiver has not shown that it dedupes ` +
        'by Idempotency-Key, so sending again could publish twice. Check whether the receiver has it, then run ' +
        `\`npm run deliveries -- resolve ${open} delivered --revision N\` (or \`unsent\` to send it again); ` +
        'set OPEN_DELIVERY_POLICY=resend if the receiver dedupes, or PUBLISH_WEBHOOK_LOOKUP_URL if it can be ' +
        'asked. Will look again.',
      details: [{ heldKey: open }],
      nextRetryDelay: HELD_RETRY_MS,
    });
  }

  /**
   * Asks the receiver whether a delivery under `key` took effect (PUBLISH_WEBHOOK_LOOKUP_URL, docs/recovery.md):
   * its receipt when it answers 200 naming this key and this version; 'absent' when it answers 404 naming this key
   * (`"found": false`); undefined for anything else (no lookup, an answer that names another key or none, a 404
   * of a route that does not exist, an HTML page, a redirect, a timeout): then the policy decides.
   */
  private async lookUp(
    key: string,
    publication: Publication,
    signal: AbortSignal,
  ): Promise<Receipt | 'absent' | undefined> {
    const template = this.options.lookupUrl;
    if (template === undefined) return undefined;
    const url = template.replace('{key}', encodeURIComponent(key));
    try {
      const answer = await getJson(url, {
        headers: { 'idempotency-key': key, ...(this.sign !== undefined ? this.sign(key, '') : {}) },
        timeoutMs: this.options.timeoutMs,
        signal,
      });
      const body = LookupBodySchema.safeParse(safeJson(answer.body));
      if (!body.success || body.data.idempotencyKey !== key) return undefined;
      if (answer.status === 404) return body.data.found === false ? 'absent' : undefined;
      if (answer.status !== 200 || body.data.found === false) return undefined;
      // Delivered only as this version: the key's delivery of another text is not this publication.
      if (body.data.textRef !== publication.textRef) return undefined;
      return { documentId: publication.documentId, revision: body.data.revision ?? 1, duplicate: true };
    } catch (err) {
      if (signal.aborted) throw err;
      return undefined;
    }
  }

  private async resendOpenClaims(): Promise<boolean> {
    const { openClaimPolicy, ledger } = this.options;
    if (openClaimPolicy === 'auto') return ledger.receiverHonoursKeys(this.origin);
    return openClaimPolicy === 'resend';
  }

  private async post(
    publication: Publication,
    idempotencyKey: string,
    owner: string,
    signal: AbortSignal,
  ): Promise<Receipt> {
    const { ledger } = this.options;
    const { what, sign } = this;
    let answer;
    // The POST is a span in the document's trace: the key and the host, never the body or the URL's path.
    const { hostname, port } = new URL(this.options.url);
    const attributes = {
      'pipeline.idempotency_key': idempotencyKey,
      'http.request.method': 'POST',
      'server.address': hostname,
      ...(port === '' ? {} : { 'server.port': Number(port) }),
    };
    try {
      answer = await inSpan('publish POST', attributes, async (span) => {
        const response = await postJson(this.options.url, publication, {
          headers: { 'idempotency-key': idempotencyKey },
          // Signed at each attempt: a retry carries a fresh timestamp under the same id, so it is never too old.
          ...(sign !== undefined ? { bodyHeaders: (body: string) => sign(idempotencyKey, body) } : {}),
          timeoutMs: this.options.timeoutMs,
          signal,
          what,
          transientType: FailureType.TransientPublishError,
        });
        span.setAttribute('http.response.status_code', response.status);
        return response;
      });
    } catch (err) {
      // Refused before anything was sent: provably not delivered. A timeout or reset leaves the claim open, noted as
      // ended unanswered (a later run of the same version then takes it as its own to settle).
      if (failedBeforeSending(err)) await ledger.unsent(idempotencyKey, owner, err.message);
      else if (!signal.aborted)
        await ledger.note(idempotencyKey, owner, err instanceof Error ? err.message : String(err));
      throw err;
    }
    if (answer.status >= 200 && answer.status < 300) {
      const body = ReceiptBodySchema.safeParse(safeJson(answer.body));
      // A receiver that already holds a newer run's publication says so; the receipt carries it to the result.
      const receipt: Receipt = {
        documentId: publication.documentId,
        revision: body.success ? (body.data.revision ?? 1) : 1,
        duplicate: body.success ? (body.data.duplicate ?? false) : false,
        ...(body.success && body.data.superseded === true ? { superseded: true } : {}),
      };
      const echoed =
        answer.headers.get('idempotency-key') === idempotencyKey ||
        (body.success && body.data.idempotencyKey === idempotencyKey);
      await ledger.delivered(idempotencyKey, owner, receipt, echoed ? this.origin : undefined);
      return { ...receipt, receiverHonoursKey: echoed };
    }
    if (answer.status >= 300 && answer.status < 400) {
      // Never followed with the signed body; and never proof that nothing was applied: a receiver may apply the
      // POST and then redirect (POST-redirect-GET's 303). The claim stays open for the lookup or an operator.
      await ledger.note(idempotencyKey, owner, `HTTP ${answer.status} redirect`);
      throw ApplicationFailure.create({
        type: FailureType.PublishRejected,
        nonRetryable: true,
        message:
          `${what} answered HTTP ${answer.status}, redirecting to ${shownLocation(answer.headers.get('location'))}; ` +
          'a webhook is never followed to another address with its signed body: set PUBLISH_WEBHOOK_URL to the ' +
          'address that takes the POST itself. The receiver may have applied this POST before redirecting, so ' +
          `its delivery (key ${idempotencyKey}) stays open: a resubmission asks PUBLISH_WEBHOOK_LOOKUP_URL or ` +
          'waits for `npm run deliveries -- resolve`, and never sends it blindly again',
      });
    }
    if (!provesNotApplied(answer.status)) {
      // A 5xx (a gateway answering for an origin that may have applied the POST), 408, 409, 425 or 429 proves
      // nothing: the claim stays open, and the retry settles it by the open-delivery policy.
      await ledger.note(idempotencyKey, owner, `HTTP ${answer.status}`);
      throw transientStatusFailure(answer, what, FailureType.TransientPublishError);
    }
    // Any other 4xx: the receiver refused the publication, so it is provably not delivered.
    await ledger.unsent(idempotencyKey, owner, `HTTP ${answer.status}`);
    throw ApplicationFailure.create({
      type: FailureType.PublishRejected,
      nonRetryable: true,
      message:
        `${what} rejected the publication of "${publication.documentId}" with HTTP ${answer.status}: ` +
        `${excerpt(answer.body)}. Retrying cannot fix a 4xx: fix the receiver or PUBLISH_WEBHOOK_URL, then rerun.`,
    });
  }
}

/** The ledger's delivery for a publication under `idempotencyKey`, POSTed with a timeout of `timeoutMs`. */
export function deliveryOf(publication: Publication, idempotencyKey: string, timeoutMs: number): Delivery {
  return {
    idempotencyKey,
    workflowId: workflowIdFor(publication.documentId),
    documentId: publication.documentId,
    version: publication.textRef,
    scheduledAt: publication.scheduledAt,
    inFlightMs: inFlightMs(timeoutMs),
  };
}

/** True for an answer that proves the receiver did not apply the request: a 4xx but 408, 409, 425 and 429. */
export function provesNotApplied(status: number): boolean {
  return status >= 400 && status < 500 && ![408, 409, 425, 429].includes(status);
}

/** A redirect's target for a message: origin and path, never the query (where tokens travel). */
function shownLocation(location: string | null): string {
  if (location === null || location === '') return '(no Location)';
  try {
    const url = new URL(location, 'http://relative.invalid');
    return url.origin === 'http://relative.invalid' ? url.pathname : `${url.origin}${url.pathname}`;
  } catch {
    return '(an unreadable Location)';
  }
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
