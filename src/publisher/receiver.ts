import http from 'node:http';
import { describeIssues, PublishInputSchema } from '../contract';
import { describeCauses } from '../lib/http';
import type { PublicationStore } from './publication-store';
import { checkSignatureHeaders, verifier } from './signature';
import { bracketed, hostMatcher, isLoopbackHost, readCappedBody } from '../lib/loopback';

/** The largest body read; a publication is a few kilobytes. A longer one is answered 413 and never buffered. */
export const MAX_BODY_BYTES = 1024 * 1024;

/**
 * How far ahead of this receiver's clock a publication's `scheduledAt` may be: clock skew between the Temporal
 * server (workflow time) and this machine. The store orders a document's runs by it, so a value far in the future
 * would make every later run look older and be answered `superseded` forever; it is refused instead.
 */
export const SCHEDULE_SKEW_MS = 5 * 60 * 1000;

export interface Receiver {
  url: string;
  close(): Promise<void>;
}

export interface ReceiverOptions {
  /** Address to bind; anything but loopback needs `secret`. */
  host?: string;
  port?: number;
  /** PUBLISH_WEBHOOK_SECRET: when set, only requests signed with it (Standard Webhooks) are taken. */
  secret?: string | undefined;
  /**
   * Names clients may put in the Host header besides the bound address (loopback binds also answer to localhost,
   * 127.0.0.1 and [::1]; wildcard binds to those and this machine's hostname), e.g. a compose service name.
   */
  hostnames?: string[];
  maxBodyBytes?: number;
  /**
   * How far ahead of this machine's clock a `scheduledAt` may be (SCHEDULE_SKEW_MS). Only tests change it: on the
   * time-skipping server, workflow time runs ahead of the wall clock.
   */
  scheduleSkewMs?: number;
  /** Connections served at once (256); more are closed as they come. */
  maxConnections?: number;
  /** How long a client may take to send its headers (10 s), and its whole request (30 s). */
  headersTimeoutMs?: number;
  requestTimeoutMs?: number;
}

/**
 * A real publish target over HTTP: `POST /publications` with an `Idempotency-Key` header (with a secret, a
 * Standard Webhooks sender's signed `webhook-id` stands for it when it sends none), backed by a PublicationStore.
 * Point PUBLISH_WEBHOOK_URL at it; tests use it as the far side of the webhook publisher.
 * Answers 201 for a new revision, 200 for a key it has seen (with the first receipt), 200 with `superseded: true`
 * and the current revision for a new key from a run older than the published one (not written), 400 for bad
 * requests, 401 for a missing or wrong signature (with a secret), 421 for a Host it does not answer to, 413 for
 * a body over `maxBodyBytes`, 500 when the store fails (the server keeps serving). `GET /publications/<key>` is the
 * lookup by key (LookupAnswer). A query string is ignored on both routes. Each refusal logs one line, no stack.
 */
export async function startReceiver(
  store: PublicationStore,
  {
    host = '127.0.0.1',
    port = 0,
    secret,
    hostnames = [],
    maxBodyBytes = MAX_BODY_BYTES,
    scheduleSkewMs = SCHEDULE_SKEW_MS,
    maxConnections = 256,
    headersTimeoutMs = 10_000,
    requestTimeoutMs = 30_000,
  }: ReceiverOptions = {},
): Promise<Receiver> {
  if (secret === undefined && !isLoopbackHost(host)) {
    throw new Error(
      `The publish target would listen on ${host}, beyond this machine, and take unsigned publications from ` +
        'anyone who reaches it: set PUBLISH_WEBHOOK_SECRET (the same value on the workers, which then sign ' +
        'every request), or bind it to loopback (PUBLISH_TARGET_HOST=127.0.0.1).',
    );
  }
  const verify = secret === undefined ? undefined : verifier(secret);
  let allowedHost: (header: string | undefined) => boolean = () => false;

  const handle = async (req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
    const reply = (status: number, body: unknown, headers: Record<string, string> = {}): void => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify(body));
    };
    // A refusal costs one line in the log (never a stack, never the body): what a stranger sends is not a fault here.
    const refuse = (status: number, error: string, headers: Record<string, string> = {}): void => {
      const shown = error.length > 300 ? `${error.slice(0, 300)}…` : error;
      console.error(`publish target: ${status} to ${req.method ?? '?'} ${shownTarget(req.url)}: ${shown}`);
      reply(status, { error }, headers);
    };
    // A name it was not given is a DNS-rebinding page or a misrouted request, not a sender: refused before the body.
    if (!allowedHost(req.headers.host)) {
      refuse(421, `this publish target does not answer to Host "${req.headers.host ?? ''}"`);
      return;
    }
    // The query string is no part of the route: a sender may carry a token there for a receiver in front of this one.
    const pathname = (req.url ?? '').split(/[?#]/, 1)[0] ?? '';
    const lookup = /^\/publications\/([^/]+)$/.exec(pathname);
    if (req.method === 'GET' && lookup?.[1] !== undefined) {
      await answerLookup(lookup[1], req, reply, refuse);
      return;
    }
    if (req.method !== 'POST' || pathname !== '/publications') {
      // No idempotencyKey in this body: a sender reads it as "wrong URL", never as "no such delivery".
      refuse(404, `no such route: ${ROUTES}`);
      return;
    }
    let key = req.headers['idempotency-key'];
    // Everything the headers can prove is checked before a byte of the body is read: an unsigned, replayed or
    // re-keyed request costs this receiver no buffer.
    if (verify !== undefined) {
      const early = checkSignatureHeaders(req.headers);
      if (!early.ok || (key !== undefined && early.id !== key)) {
        const error = early.ok
          ? 'the webhook-id header must equal the Idempotency-Key header (the signed key)'
          : early.reason;
        refuse(401, error, { connection: 'close' });
        req.resume();
        return;
      }
      // A Standard Webhooks sender that sends no Idempotency-Key has its key in webhook-id, which it signs.
      key = early.id;
    }
    const raw = await readCappedBody(req, maxBodyBytes);
    if (raw === 'too-large') {
      // Closing the connection stops the upload; what is still in flight is read and dropped, never kept.
      refuse(413, `the body is over ${maxBodyBytes} bytes`, { connection: 'close' });
      req.resume();
      return;
    }
    if (verify !== undefined) {
      // The signature covers webhook-id, which is the key (checked above): no replay under a new key.
      const verdict = verify(req.headers, raw);
      if (!verdict.ok) {
        refuse(401, verdict.reason);
        return;
      }
    }
    if (typeof key !== 'string' || key.trim() === '') {
      refuse(400, 'the Idempotency-Key header is required');
      return;
    }
    const badKey = keyProblem(key);
    if (badKey !== undefined) {
      refuse(400, `the Idempotency-Key ${badKey}`);
      return;
    }
    let body: unknown;
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch {
      refuse(400, 'the body must be JSON');
      return;
    }
    const parsed = PublishInputSchema.safeParse(body);
    if (!parsed.success) {
      refuse(400, `invalid publication: ${describeIssues(parsed.error)}`);
      return;
    }
    // A NUL in a text column is refused by PostgreSQL: a 400 for the sender, not a store failure to log.
    if (holdsNul(parsed.data)) {
      refuse(400, 'invalid publication: its text must not contain NUL characters (\\u0000)');
      return;
    }
    const { scheduledAt } = parsed.data;
    const ahead = scheduledAt === undefined ? 0 : scheduledAt - Date.now();
    if (ahead > scheduleSkewMs) {
      refuse(
        400,
        `scheduledAt is ${Math.round(ahead / 1000)} s ahead of this receiver's clock (at most ` +
          `${scheduleSkewMs / 1000} s allowed): it would outrank every later run of the document. Fix the ` +
          "sender's clock (NTP) or the value.",
      );
      return;
    }
    let receipt;
    try {
      receipt = await store.publish(parsed.data, key);
    } catch (err) {
      console.error(
        `publish target: the publication store (${store.where}) failed for key ${JSON.stringify(key)}: ` +
          describeCauses(err),
      );
      reply(500, {
        error: 'the publication store failed; sending the same Idempotency-Key again is safe',
      });
      return;
    }
    // Echoing the key tells the sender this receiver dedupes by it, so a lost answer may be sent again.
    reply(receipt.duplicate || receipt.superseded === true ? 200 : 201, receipt, { 'idempotency-key': key });
  };

  // Node enforces the header and request timeouts when it checks its connections (every 30 s by default).
  const checkEveryMs = Math.min(1_000, headersTimeoutMs / 2);
  /**
   * `GET /publications/<key>` (a query string ignored): whether a delivery under this key took effect here, so a
   * sender that lost an answer can ask instead of holding the delivery for a person or sending twice
   * (PUBLISH_WEBHOOK_LOOKUP_URL). The answer names the key it is about: 200 `{ idempotencyKey, documentId,
   * revision, textRef }`, 404 `{ idempotencyKey, found: false }` (an unknown route's 404 names none). With a secret,
   * the request is signed like a POST with an empty body, its webhook-id the key asked about; the signature is
   * checked before anything is decoded from the path.
   */
  const answerLookup = async (
    encodedKey: string,
    req: http.IncomingMessage,
    reply: (status: number, body: unknown, headers?: Record<string, string>) => void,
    refuse: (status: number, error: string) => void,
  ): Promise<void> => {
    const verdict = verify?.(req.headers, Buffer.alloc(0));
    if (verdict !== undefined && !verdict.ok) {
      refuse(401, verdict.reason);
      return;
    }
    const key = decodedSegment(encodedKey);
    if (key === undefined) {
      refuse(400, 'the key in the path is not valid percent-encoded UTF-8');
      return;
    }
    const badKey = keyProblem(key);
    if (badKey !== undefined) {
      refuse(400, `the key in the path ${badKey}`);
      return;
    }
    if (verdict !== undefined && verdict.id !== key) {
      refuse(401, 'the webhook-id header must be the key looked up');
      return;
    }
    let found;
    try {
      found = await store.revisionOfKey(key);
    } catch (err) {
      console.error(
        `publish target: the publication store (${store.where}) failed to look up ${JSON.stringify(key)}: ` +
          describeCauses(err),
      );
      reply(500, { error: 'the publication store failed; ask again' });
      return;
    }
    if (found === undefined) {
      reply(404, { idempotencyKey: key, found: false } satisfies LookupAnswer);
      return;
    }
    const answer: LookupAnswer = {
      idempotencyKey: key,
      documentId: found.documentId,
      revision: found.revision,
      ...(found.textRef === undefined ? {} : { textRef: found.textRef }),
    };
    reply(200, answer, { 'idempotency-key': key });
  };

  const server = http.createServer({ connectionsCheckingInterval: checkEveryMs }, (req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (req.socket.destroyed) return; // the client went away mid-request: nothing to answer
      // A bug of this receiver, not of the sender; still one line, with where it was thrown, so no request can make
      // the log grow by a stack trace.
      const at =
        err instanceof Error ? err.stack?.split('\n').find((line) => /^\s+at /.test(line)) : undefined;
      console.error(
        `publish target: 500 to ${req.method ?? '?'} ${shownTarget(req.url)}: ${describeCauses(err)}` +
          (at === undefined ? '' : ` (${at.trim()})`),
      );
      if (res.headersSent) res.destroy();
      else res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":"internal error"}');
    });
  });
  // A sender gets 10 s to send its headers and 30 s for the whole request (Node's default is 300 s); past the cap,
  // new connections are closed at once, so stalled uploads cannot pile up.
  server.headersTimeout = headersTimeoutMs;
  server.requestTimeout = requestTimeoutMs;
  server.maxConnections = maxConnections;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('receiver did not bind a TCP port');
  allowedHost = hostMatcher(host, address.port, hostnames);
  return {
    url: `http://${bracketed(host)}:${address.port}/publications`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** The routes, as an unknown one's 404 names them. */
const ROUTES = 'POST /publications and GET /publications/<Idempotency-Key> are the routes';

/** The longest key taken; a run's key (`<workflow run ID>:<step>`) is under a hundred characters. */
export const MAX_KEY_LENGTH = 512;

/**
 * The lookup's answer (`GET /publications/<key>`), the contract PUBLISH_WEBHOOK_LOOKUP_URL expects: it names the
 * key asked about, so a sender never takes another answer (a proxy's page, another route's 404) for this key's.
 * 200: the revision the key wrote, and `textRef`, the version of the document it carried (absent where the
 * receiver does not keep it). 404: `found: false`, nothing was published under the key.
 */
export type LookupAnswer =
  | { idempotencyKey: string; documentId: string; revision: number; textRef?: string }
  | { idempotencyKey: string; found: false };

/** Why a key cannot be one (a clause: "is empty"), or undefined. */
function keyProblem(key: string): string | undefined {
  if (key.length > MAX_KEY_LENGTH) return `is over ${MAX_KEY_LENGTH} characters`;
  if (/[\u0000-\u001f\u007f]/.test(key)) return 'must not contain control characters';
  return undefined;
}

/** A path segment percent-decoded, or undefined when it is not valid percent-encoded UTF-8 (`%E0%A4%A`). */
function decodedSegment(segment: string): string | undefined {
  try {
    return decodeURIComponent(segment);
  } catch {
    return undefined;
  }
}

/** True when any string in `value` holds a NUL. */
function holdsNul(value: unknown): boolean {
  if (typeof value === 'string') return value.includes('\u0000');
  if (Array.isArray(value)) return value.some(holdsNul);
  if (typeof value === 'object' && value !== null) return Object.values(value).some(holdsNul);
  return false;
}

/**
 * A request target for a log line: its path, quoted (control characters escaped) and cut at 200 characters; a
 * query string (which may carry a token) shown as `?…`.
 */
function shownTarget(target: string | undefined): string {
  const [pathname = '', query] = (target ?? '').split(/\?(.*)/s, 2);
  const cut = pathname.length > 200 ? `${pathname.slice(0, 200)}…` : pathname;
  return JSON.stringify(query === undefined ? cut : `${cut}?…`);
}
