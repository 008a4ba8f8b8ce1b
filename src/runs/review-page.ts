import { createHash, createHmac, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import type { Client } from '@temporalio/client';
import type { BlobStore } from '../documents/blobs';
import type { JsonValue } from '../contract';
import {
  bracketed,
  closeServer,
  hostMatcher,
  isLoopbackHost,
  readCappedBody,
  serverNames,
} from '../lib/loopback';
import { formatCost } from '../model/pricing';
import { describeOutcome, reviewPublishes, REVIEWER_MAX } from '../contract/review';
import type { ReviewDecision, ReviewDraft, ReviewOutcome } from '../contract/review';
import { registeredModelSteps } from '../steps/registry';
import { fieldLimits } from '../steps/review-edits';
import { awaitingCount, awaitingReview, decide, draftOf, ServerUnavailableError } from './review-queue';

export interface ReviewPageOptions {
  host?: string;
  port?: number;
  /**
   * REVIEW_PAGE_TOKEN: the password every request must give (HTTP Basic; the user name is the reviewer the
   * decisions are recorded under). Needed beyond loopback; at least MIN_TOKEN_CHARS characters.
   */
  token?: string | undefined;
  /**
   * REVIEW_PAGE_ORIGIN: the origin reviewers open behind a reverse proxy (`https://review.example.com`). Its host
   * is served besides the page's own names, and its forms are taken as the page's own.
   */
  publicOrigin?: string | undefined;
  /**
   * Where the page keeps the key its forms are signed with (DATA_DIR/review-page.key), so a form opened before the
   * page restarted still sends. Without it, a key of this process only.
   */
  keyFile?: string | undefined;
  /** Who decides on a page without a password (loopback only): the person serving it (REVIEWER, else the login). */
  reviewer?: string | undefined;
  /** The most drafts one page shows (the oldest first); the page says how many more wait. */
  limit?: number;
}

export interface ReviewPage {
  url: string;
  close(): Promise<void>;
}

/** A password shorter than this is refused: one a person can guess is no lock on publishing. */
export const MIN_TOKEN_CHARS = 32;
/**
 * The longest form a decision may send: a 20,000-character edit in any script, percent-encoded (up to 9 bytes a
 * character), its list fields and a reason, with room to spare. A longer one is answered 413, unread.
 */
export const MAX_FORM_BYTES = 512 * 1024;
/** How much of a document's text the page shows beside its draft; a longer text is marked where it is cut. */
const SOURCE_SHOWN_CHARS = 200_000;
/** Empty boxes a list field gets for items to add, within what its step allows. */
const SPARE_ITEMS = 3;

/**
 * The review page: the queue of drafts, each beside its source text, with approve, edit and reject. Safe to leave
 * running: it answers only to its own host names (a DNS-rebinding page gets 421); it changes nothing on a GET;
 * every POST must come from the page's own origin, where the browser says (its own names, or REVIEW_PAGE_ORIGIN,
 * never what the Host header claims), and carry the form token the page signed for that draft; a body over
 * MAX_FORM_BYTES is refused unread; every text is escaped, and the page's Content-Security-Policy runs no script;
 * beyond loopback it refuses to start without a strong token. Decisions are recorded under the reviewer the page
 * authenticated, not under a name typed into a form.
 */
export async function startReviewPage(
  client: Client,
  blobs: BlobStore,
  {
    host = '127.0.0.1',
    port = 0,
    token,
    publicOrigin,
    keyFile,
    reviewer,
    limit = 200,
  }: ReviewPageOptions = {},
): Promise<ReviewPage> {
  if (token === undefined && !isLoopbackHost(host))
    throw new Error(
      `The review page would listen on ${host}, beyond this machine, and let anyone who reaches it publish or ` +
        'reject documents: set REVIEW_PAGE_TOKEN (the password the page then asks for), or bind it to loopback ' +
        '(--host 127.0.0.1).',
    );
  if (token !== undefined && token.length < MIN_TOKEN_CHARS)
    throw new Error(
      `REVIEW_PAGE_TOKEN is ${token.length} characters: the review page needs a password of at least ` +
        `${MIN_TOKEN_CHARS} (a random one: npm run keygen prints one).`,
    );
  const publicUrl = publicOrigin === undefined ? undefined : new URL(publicOrigin);
  if (publicOrigin !== undefined && publicUrl?.origin !== publicOrigin.replace(/\/$/, ''))
    throw new Error(
      `REVIEW_PAGE_ORIGIN must be an origin only, like https://review.example.com, not ${publicOrigin}`,
    );
  if (token === undefined && (reviewer === undefined || reviewer.trim() === ''))
    throw new Error(
      'The review page without a password records its decisions under the reviewer serving it: set REVIEWER.',
    );
  const key = formKey(keyFile);
  const sign = (purpose: string, value: string): string =>
    createHmac('sha256', key).update(`${purpose}\n${value}`).digest('base64url');
  let allowedHost: (header: string | undefined) => boolean = () => false;
  let origins = new Set<string>();

  const server = http.createServer((req, res) => {
    void handle(req, res).catch((err: unknown) => {
      if (res.headersSent) return;
      if (err instanceof ServerUnavailableError)
        send(res, 503, page('Temporal server down', `<p>${escapeHtml(err.message)}</p>`));
      else send(res, 500, page('Error', `<p>${escapeHtml(String(err))}</p>`));
    });
  });
  // A reviewer's browser sends its headers at once; a client that trickles them, or its body, is cut off.
  server.headersTimeout = 10_000;
  server.requestTimeout = 60_000;

  async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    // A name this page was not given is a DNS-rebinding page (or a misrouted request): nothing is answered to it.
    if (!allowedHost(req.headers.host)) {
      refuse(res, 421, `this review page does not answer to Host "${req.headers.host ?? ''}"`);
      return;
    }
    const who = reviewerOf(req.headers.authorization);
    if (who === undefined) {
      res
        .writeHead(401, { 'www-authenticate': 'Basic realm="review", charset="UTF-8"', connection: 'close' })
        .end(
          'The review page needs its password (REVIEW_PAGE_TOKEN), and your name as the user name: decisions ' +
            'are recorded under it.\n',
        );
      req.resume();
      return;
    }
    const url = new URL(req.url ?? '/', 'http://review-page');
    if (req.method === 'GET' && url.pathname === '/') {
      const said = url.searchParams.get('said');
      const proof = url.searchParams.get('sig') ?? '';
      // Only a message this page wrote is shown: a link cannot put words in the page's mouth.
      const note = said !== null && sameToken(proof, sign('said', said)) ? said : undefined;
      send(res, 200, await queuePage(who, { said: note }));
      return;
    }
    if (req.method === 'POST' && url.pathname === '/decide') {
      const refusal = crossSite(req, origins);
      if (refusal !== undefined) {
        refuse(res, 403, refusal);
        req.resume();
        return;
      }
      const body = await readCappedBody(req, MAX_FORM_BYTES);
      if (body === 'too-large') {
        refuse(res, 413, `a decision's form is at most ${MAX_FORM_BYTES} bytes; this one is longer`);
        req.resume();
        return;
      }
      const form = new URLSearchParams(body.toString('utf8'));
      const workflowId = form.get('workflowId') ?? '';
      if (!sameToken(form.get('csrf') ?? '', sign('form', workflowId))) {
        refuse(res, 403, 'this form is not from this page (reload the page and send it again)');
        return;
      }
      const answer = await decideFrom(form, workflowId, who);
      if (answer.ok) {
        const said = answer.said;
        res
          .writeHead(303, {
            location: `/?said=${encodeURIComponent(said)}&sig=${sign('said', said)}`,
          })
          .end();
        return;
      }
      // Refused: the page again, the reviewer's words kept in the form, and why.
      send(res, 422, await queuePage(who, { refused: { workflowId, why: answer.refused, form } }));
      return;
    }
    const allowed = url.pathname === '/decide' ? 'POST' : 'GET';
    res.writeHead(url.pathname === '/' || url.pathname === '/decide' ? 405 : 404, { allow: allowed }).end();
  }

  /** The reviewer a request is from: the HTTP Basic user name behind the password, or the page's own reviewer. */
  function reviewerOf(header: string | undefined): string | undefined {
    if (token === undefined) return reviewer?.trim();
    const match = /^Basic ([A-Za-z0-9+/=]+)$/.exec(header ?? '');
    if (match === null) return undefined;
    const decoded = Buffer.from(match[1] ?? '', 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 0 || !sameToken(decoded.slice(colon + 1), token)) return undefined;
    const name = decoded.slice(0, colon).trim();
    return name === '' || name.length > REVIEWER_MAX ? undefined : name;
  }

  async function decideFrom(
    form: URLSearchParams,
    workflowId: string,
    who: string,
  ): Promise<{ ok: true; said: string } | { ok: false; refused: string }> {
    const action = form.get('action');
    let decision: ReviewDecision;
    if (action === 'approve') decision = { action, reviewer: who };
    else if (action === 'reject') decision = { action, reviewer: who, reason: form.get('reason') ?? '' };
    else if (action === 'edit') {
      const draft = await draftOf(client, workflowId);
      if (draft === undefined) return { ok: false, refused: `${workflowId} has no draft awaiting review` };
      // Only what the reviewer changed is an edit; an unchanged field stays the draft's.
      const fields: Record<string, JsonValue> = {};
      for (const [name, drafted] of Object.entries(draft.fields)) {
        const sent = fieldFromForm(form, name, drafted);
        if (sent !== undefined && !sameValue(sent, drafted)) fields[name] = sent;
      }
      if (Object.keys(fields).length === 0)
        return { ok: false, refused: 'nothing was changed: approve publishes the draft as it is' };
      decision = { action, reviewer: who, fields };
    } else return { ok: false, refused: 'unknown action' };
    // The form's update ID: a double click or a resent form is the same decision, answered once.
    const updateId = /^[A-Za-z0-9-]{8,80}$/.test(form.get('updateId') ?? '')
      ? (form.get('updateId') as string)
      : randomUUID();
    const answer = await decide(client, workflowId, decision, `page-${updateId}`);
    return answer.ok
      ? { ok: true, said: `${workflowId}: ${describeOutcome(answer.outcome)}. ${whatNext(answer.outcome)}` }
      : { ok: false, refused: `${workflowId}: refused: ${answer.refused}` };
  }

  async function queuePage(
    who: string,
    { said, refused }: { said?: string | undefined; refused?: Refused } = {},
  ): Promise<string> {
    const [queue, total] = await Promise.all([awaitingReview(client, limit), awaitingCount(client)]);
    const steps = registeredModelSteps();
    const cards = await Promise.all(
      queue.map(async ({ workflowId, draft }) => {
        const text = (await blobs.get(draft.textRef))?.toString('utf8') ?? '(the text is not in the store)';
        const kept = refused?.workflowId === workflowId ? refused : undefined;
        return draftCard(workflowId, draft, text, {
          csrf: sign('form', workflowId),
          kept,
          limitsOf: (name) => fieldLimits(steps, name),
        });
      }),
    );
    const note =
      (said === undefined ? '' : `<p class="said" role="status">${escapeHtml(said)}</p>`) +
      (refused === undefined
        ? ''
        : `<p class="refused" role="alert">${escapeHtml(refused.why)} Your words are kept in the form below.</p>`);
    const unanswered = queue.unanswered ?? [];
    const failed = queue.failed ?? [];
    const waiting =
      (unanswered.length === 0
        ? ''
        : `<p class="refused">${unanswered.length} more await review, but no worker answered for their drafts: ` +
          'start one (npm run worker) and reload.</p>') +
      failed
        .map(
          ({ workflowId, error }) =>
            `<p class="failed">${escapeHtml(workflowId)} awaits review, but its draft could not be read: ` +
            `${escapeHtml(error)}</p>`,
        )
        .join('');
    const shown = queue.length + unanswered.length + failed.length;
    const more =
      total !== undefined && total > shown
        ? `<p class="refused">Showing ${shown} of the ${total} runs awaiting review (at most ${limit} a page): ` +
          'decide these, then reload for the rest.</p>'
        : '';
    const body =
      cards.length === 0 && waiting === '' && more === ''
        ? '<p>Nothing awaits review.</p>'
        : `${more}${waiting}${cards.join('\n')}`;
    return page(
      `Review (${total ?? shown})`,
      `<p class="who">Deciding as <strong>${escapeHtml(who)}</strong>.</p>\n${note}\n${body}`,
    );
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const address = server.address();
  const bound = address !== null && typeof address === 'object' ? address.port : port;
  const names = serverNames(host);
  const proxied = publicUrl?.host.toLowerCase();
  const ownHost = hostMatcher(host, bound);
  allowedHost = (header) => ownHost(header) || (proxied !== undefined && header?.toLowerCase() === proxied);
  origins = new Set([
    ...names.map((name) => `http://${name}:${bound}`),
    ...(publicUrl === undefined ? [] : [publicUrl.origin]),
  ]);
  return { url: `http://${bracketed(host)}:${bound}/`, close: () => closeServer(server) };
}

/** A decision the page refused, with the form it came in, so the reviewer's words are shown again. */
interface Refused {
  workflowId: string;
  why: string;
  form: URLSearchParams;
}

/** What happens after a decision, in the reviewer's words. */
function whatNext(outcome: ReviewOutcome): string {
  if (!reviewPublishes(outcome)) return 'Nothing is published; the run ends as rejected.';
  return outcome.outcome === 'edited'
    ? "The run now publishes your edited fields in place of the draft's."
    : 'The run now publishes the draft as shown.';
}

/** A draft field as the edit form sent it: a text from its box, a list from its boxes (empty boxes left out). */
function fieldFromForm(form: URLSearchParams, name: string, drafted: JsonValue): JsonValue | undefined {
  // A browser sends a textarea's line breaks as CRLF: read back as the draft writes them, an untouched text is unchanged.
  if (typeof drafted === 'string') return form.get(`field:${name}`)?.replace(/\r\n?/g, '\n') ?? undefined;
  if (Array.isArray(drafted))
    return form
      .getAll(`field:${name}`)
      .map((item) => item.trim())
      .filter((item) => item !== '');
  return undefined;
}

/** True when a sent field is the drafted one, leading and trailing blanks aside (the run trims them). */
function sameValue(sent: JsonValue, drafted: JsonValue): boolean {
  const trimmed = (v: JsonValue): JsonValue =>
    typeof v === 'string' ? v.trim() : Array.isArray(v) ? v.map(trimmed) : v;
  return JSON.stringify(trimmed(sent)) === JSON.stringify(trimmed(drafted));
}

/** One draft: its facts, its source beside its fields, and the three decisions. */
function draftCard(
  workflowId: string,
  draft: ReviewDraft,
  text: string,
  {
    csrf,
    kept,
    limitsOf,
  }: {
    csrf: string;
    kept: Refused | undefined;
    limitsOf: (name: string) => { maxLength?: number; maxItems?: number };
  },
): string {
  const cost = draft.costUsd === null ? 'no price' : formatCost(draft.costUsd);
  const hidden = (action: string): string =>
    // A disabled first button: Enter in a box does not send the form, only a click on its own button does.
    '<button type="submit" disabled hidden aria-hidden="true" tabindex="-1"></button>' +
    `<input type="hidden" name="csrf" value="${csrf}">` +
    `<input type="hidden" name="workflowId" value="${escapeHtml(workflowId)}">` +
    `<input type="hidden" name="updateId" value="${randomUUID()}">` +
    `<input type="hidden" name="action" value="${action}">`;
  const keptEdit = kept?.form.get('action') === 'edit' ? kept.form : undefined;
  const shown = Object.entries(draft.fields)
    .map(
      ([name, value]) =>
        `<dt>${escapeHtml(label(name))}</dt><dd class="field-${escapeHtml(name)}">${shownValue(value)}</dd>`,
    )
    .join('');
  const boxes = Object.entries(draft.fields)
    .map(([name, drafted]) => editBox(name, drafted, keptEdit, limitsOf(name)))
    .join('\n');
  const cut = text.length > SOURCE_SHOWN_CHARS;
  const source =
    `<pre class="source">${escapeHtml(text.slice(0, SOURCE_SHOWN_CHARS))}</pre>` +
    (cut
      ? `<p class="refused cut">The source is cut here: ${text.length - SOURCE_SHOWN_CHARS} more characters ` +
        'are not shown (a claim in the draft may come from them).</p>'
      : '');
  const reason = kept?.form.get('action') === 'reject' ? (kept.form.get('reason') ?? '') : '';
  return `<section class="draft" data-document="${escapeHtml(draft.documentId)}">
<h2>${escapeHtml(draft.title)}</h2>
<p class="meta">${escapeHtml(draft.documentId)} · ${escapeHtml(`${draft.model.provider}/${draft.model.model}`)} · ${escapeHtml(cost)} · waiting since ${when(draft.awaitingSince)} · deadline ${when(draft.deadline)} (then ${draft.onTimeout === 'publish' ? 'published as drafted' : 'rejected'})</p>
<div class="columns">
<div><h3>Source</h3>${source}</div>
<div><h3>Draft</h3><dl class="fields">${shown}</dl>
<form method="post" action="/decide" class="approve">${hidden('approve')}<button>Approve</button>
<span class="next">publishes the draft as shown</span></form>
<form method="post" action="/decide" class="edit"><h3>Edit</h3>${hidden('edit')}
${boxes}
<button>Publish edited</button> <span class="next">publishes your fields in place of the draft's</span></form>
<form method="post" action="/decide" class="reject">${hidden('reject')}
<label>Reason for rejecting <input name="reason" required maxlength="2000" value="${escapeHtml(reason)}"></label>
<button>Reject</button> <span class="next">publishes nothing; the reason is kept</span></form>
</div></div></section>`;
}

/** A field's edit box(es): a text's textarea, a list's one box an item and spare boxes, within its step's limits. */
function editBox(
  name: string,
  drafted: JsonValue,
  kept: URLSearchParams | undefined,
  limits: { maxLength?: number; maxItems?: number },
): string {
  const maxlength = limits.maxLength === undefined ? '' : ` maxlength="${limits.maxLength}"`;
  const field = `field:${escapeHtml(name)}`;
  if (typeof drafted === 'string') {
    const value = kept?.get(`field:${name}`) ?? drafted;
    return `<label>${escapeHtml(label(name))} <textarea name="${field}" rows="5" required${maxlength}>${escapeHtml(value)}</textarea></label>`;
  }
  if (Array.isArray(drafted) && drafted.every((item) => typeof item === 'string')) {
    const items =
      kept === undefined
        ? (drafted as string[])
        : kept.getAll(`field:${name}`).filter((i) => i.trim() !== '');
    const slots = Math.max(items.length, Math.min(items.length + SPARE_ITEMS, limits.maxItems ?? Infinity));
    const inputs = Array.from(
      { length: slots },
      (_, i) =>
        `<input name="${field}" value="${escapeHtml(items[i] ?? '')}"${maxlength} aria-label="${escapeHtml(label(name))} ${i + 1}">`,
    ).join('');
    const most = limits.maxItems === undefined ? '' : `, at most ${limits.maxItems}`;
    return `<fieldset class="list"><legend>${escapeHtml(label(name))} (one a box; empty boxes are left out${most})</legend>${inputs}</fieldset>`;
  }
  return '';
}

/** A field as the draft shows it: a text as written, a list one item a chip. */
function shownValue(value: JsonValue): string {
  if (Array.isArray(value))
    return `<ul class="items">${value.map((item) => `<li>${escapeHtml(typeof item === 'string' ? item : JSON.stringify(item))}</li>`).join('')}</ul>`;
  return escapeHtml(typeof value === 'string' ? value : JSON.stringify(value));
}

/** `summary` as a label: `Summary`. */
function label(name: string): string {
  return name.charAt(0).toUpperCase() + name.slice(1);
}

/** A time in UTC and in the page's local time zone. */
function when(epochMs: number): string {
  const date = new Date(epochMs);
  const local = date.toLocaleString('en-GB', { timeZoneName: 'short' });
  return `<time datetime="${date.toISOString()}">${date.toISOString().replace('T', ' ').slice(0, 19)} UTC</time> (${escapeHtml(local)})`;
}

/**
 * The key the page signs its forms with: kept in `file` (made on first use, readable by its owner only) so forms
 * outlive a restart, or random for this process where no file is given.
 */
function formKey(file: string | undefined): Buffer {
  if (file === undefined) return randomBytes(32);
  try {
    const kept = fs.readFileSync(file);
    if (kept.length >= 32) return kept;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const key = randomBytes(32);
  fs.writeFileSync(file, key, { mode: 0o600 });
  return key;
}

/**
 * Why a POST is refused as cross-site, from what the browser says of its origin; undefined when it is not. The
 * Origin must be one of the page's own (its names, REVIEW_PAGE_ORIGIN): never derived from the Host header, which
 * a rebinding page chooses.
 */
function crossSite(req: http.IncomingMessage, origins: Set<string>): string | undefined {
  const site = req.headers['sec-fetch-site'];
  if (site !== undefined && site !== 'same-origin' && site !== 'none')
    return `a decision sent from another site (${site}) is refused`;
  const from = req.headers.origin;
  if (from !== undefined && !origins.has(from.toLowerCase()))
    return `a decision sent from ${from} is refused: only this page may send one`;
  return undefined;
}

/** Compares in constant time (the digests have one length whatever was sent). */
function sameToken(given: string, expected: string): boolean {
  const digest = (s: string): Buffer => createHash('sha256').update(s).digest();
  return timingSafeEqual(digest(given), digest(expected));
}

/** A refusal: its status and one line saying why, as a page. */
function refuse(res: http.ServerResponse, status: number, why: string): void {
  send(res, status, page('Refused', `<p class="refused">${escapeHtml(why)}</p>`), { connection: 'close' });
}

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function send(
  res: http.ServerResponse,
  status: number,
  html: string,
  headers: Record<string, string> = {},
): void {
  res
    .writeHead(status, {
      ...headers,
      'content-type': 'text/html; charset=utf-8',
      // No script runs on this page, whatever a document holds; forms post only to it; no framing.
      'content-security-policy':
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
      'x-content-type-options': 'nosniff',
      // same-origin, not no-referrer: with no-referrer the browser sends `Origin: null` on the page's own forms.
      'referrer-policy': 'same-origin',
      'cache-control': 'no-store',
    })
    .end(html);
}

function page(title: string, body: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escapeHtml(title)}</title>
<style>
body { font: 15px/1.4 system-ui, sans-serif; margin: 1.5rem; max-width: 72rem; }
.draft { border: 1px solid #ccc; border-radius: 6px; padding: 0 1rem 1rem; margin-bottom: 1.5rem; }
.columns { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }
.source { white-space: pre-wrap; max-height: 24rem; overflow: auto; background: #f6f6f6; padding: .5rem; }
.meta { color: #555; font-size: 13px; } .said { background: #eef6ee; padding: .5rem; }
.refused { background: #fbeeee; padding: .5rem; } .who { color: #333; }
dl.fields dt { font-weight: 600; margin-top: .5rem; } dl.fields dd { margin: 0; }
ul.items { list-style: none; padding: 0; margin: 0; display: flex; flex-wrap: wrap; gap: .25rem; }
ul.items li { background: #eef; border-radius: 4px; padding: 0 .4rem; }
form { margin: .75rem 0; } label { display: block; margin: .25rem 0; } textarea, input { width: 100%; }
fieldset.list { border: 0; padding: 0; margin: .25rem 0; } fieldset.list input { margin: .1rem 0; }
.next { color: #555; font-size: 13px; } form h3 { margin: .25rem 0; }
</style></head><body><h1>${escapeHtml(title)}</h1>
${body}
</body></html>`;
}
