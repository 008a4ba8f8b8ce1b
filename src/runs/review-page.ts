import { createHash, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { Client } from '@temporalio/client';
import type { BlobStore } from '../documents/blobs';
import { closeServer, isLoopbackHost, readBody } from '../lib/loopback';
import { formatCost } from '../model/pricing';
import { describeOutcome } from '../contract/review';
import type { ReviewDecision } from '../contract/review';
import { awaitingReview, decide, ServerUnavailableError } from './review-queue';

export interface ReviewPageOptions {
  host?: string;
  port?: number;
  /** REVIEW_PAGE_TOKEN: the password every request must give (HTTP Basic, any user name). Needed beyond loopback. */
  token?: string | undefined;
}

export interface ReviewPage {
  url: string;
  close(): Promise<void>;
}

/** The longest form a decision may send. */
const MAX_FORM_BYTES = 64 * 1024;
/** How much of a document's text the page shows beside its draft. */
const SOURCE_SHOWN_CHARS = 20_000;

/**
 * The review page: the queue of drafts, each beside its source text, with approve, edit and reject. Safe to leave
 * running: it changes nothing on a GET; every POST must carry the page's own form token and, where the browser
 * says, come from the page's own origin (a forged cross-site form is refused); every text is escaped, and the
 * page's Content-Security-Policy runs no script at all; beyond loopback it refuses to start without a token.
 */
export async function startReviewPage(
  client: Client,
  blobs: BlobStore,
  { host = '127.0.0.1', port = 0, token }: ReviewPageOptions = {},
): Promise<ReviewPage> {
  if (token === undefined && !isLoopbackHost(host))
    throw new Error(
      `The review page would listen on ${host}, beyond this machine, and let anyone who reaches it publish or ` +
        'reject documents: set REVIEW_PAGE_TOKEN (the password the page then asks for), or bind it to loopback ' +
        '(--host 127.0.0.1).',
    );
  // The form token: random per page process, sent in every form, compared on every POST.
  const formToken = randomBytes(24).toString('base64url');
  let origin = '';
  const server = http.createServer((req, res) => {
    void handle(req, res).catch((err: unknown) => {
      if (res.headersSent) return;
      if (err instanceof ServerUnavailableError)
        send(res, 503, page('Temporal server down', `<p>${escapeHtml(err.message)}</p>`));
      else send(res, 500, page('Error', `<p>${escapeHtml(String(err))}</p>`));
    });
  });
  async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    if (token !== undefined && !authorized(req.headers.authorization, token)) {
      res
        .writeHead(401, { 'www-authenticate': 'Basic realm="review", charset="UTF-8"' })
        .end('Password needed\n');
      return;
    }
    const url = new URL(req.url ?? '/', origin);
    if (req.method === 'GET' && url.pathname === '/') {
      send(res, 200, await queuePage(url.searchParams.get('said') ?? undefined));
      return;
    }
    if (req.method === 'POST' && url.pathname === '/decide') {
      const refusal = crossSite(req, origin);
      const body = await readBody(req);
      const form = new URLSearchParams(body.length > MAX_FORM_BYTES ? '' : body.toString('utf8'));
      if (refusal !== undefined || !sameToken(form.get('csrf') ?? '', formToken)) {
        send(res, 403, page('Refused', `<p>${escapeHtml(refusal ?? 'this form is not from this page')}</p>`));
        return;
      }
      const said = await decideFrom(form);
      res.writeHead(303, { location: `/?said=${encodeURIComponent(said)}` }).end();
      return;
    }
    const allowed = url.pathname === '/decide' ? 'POST' : 'GET';
    res.writeHead(url.pathname === '/' || url.pathname === '/decide' ? 405 : 404, { allow: allowed }).end();
  }

  async function decideFrom(form: URLSearchParams): Promise<string> {
    const workflowId = form.get('workflowId') ?? '';
    const reviewer = form.get('reviewer') ?? '';
    const action = form.get('action');
    let decision: ReviewDecision;
    if (action === 'approve') decision = { action, reviewer };
    else if (action === 'reject') decision = { action, reviewer, reason: form.get('reason') ?? '' };
    else if (action === 'edit') {
      const tags = (form.get('tags') ?? '')
        .split(',')
        .map((t) => t.trim())
        .filter((t) => t !== '');
      decision = { action, reviewer, fields: { summary: form.get('summary') ?? '', tags } };
    } else return 'Refused: unknown action';
    // The form's update ID: a double click or a resent form is the same decision, answered once.
    const updateId = /^[A-Za-z0-9-]{8,80}$/.test(form.get('updateId') ?? '')
      ? (form.get('updateId') as string)
      : randomUUID();
    const answer = await decide(client, workflowId, decision, `page-${updateId}`);
    return answer.ok
      ? `${workflowId}: ${describeOutcome(answer.outcome)}`
      : `${workflowId}: refused: ${answer.refused}`;
  }

  async function queuePage(said: string | undefined): Promise<string> {
    const queue = await awaitingReview(client);
    const cards = await Promise.all(
      queue.map(async ({ workflowId, draft }) => {
        const text = (await blobs.get(draft.textRef))?.toString('utf8') ?? '(the text is not in the store)';
        const summary = typeof draft.fields.summary === 'string' ? draft.fields.summary : '';
        const tags = Array.isArray(draft.fields.tags) ? draft.fields.tags.join(', ') : '';
        const cost = draft.costUsd === null ? 'no price' : formatCost(draft.costUsd);
        const hidden = (action: string): string =>
          `<input type="hidden" name="csrf" value="${formToken}">` +
          `<input type="hidden" name="workflowId" value="${escapeHtml(workflowId)}">` +
          `<input type="hidden" name="updateId" value="${randomUUID()}">` +
          `<input type="hidden" name="action" value="${action}">` +
          `<label>Reviewer <input name="reviewer" required maxlength="200"></label>`;
        return `<section class="draft" data-document="${escapeHtml(draft.documentId)}">
<h2>${escapeHtml(draft.title)}</h2>
<p class="meta">${escapeHtml(draft.documentId)} · ${escapeHtml(`${draft.model.provider}/${draft.model.model}`)} · ${escapeHtml(cost)} · waiting since ${new Date(draft.awaitingSince).toISOString()} · deadline ${new Date(draft.deadline).toISOString()} (then ${draft.onTimeout === 'publish' ? 'published as drafted' : 'rejected'})</p>
<div class="columns">
<div><h3>Source</h3><pre class="source">${escapeHtml(text.slice(0, SOURCE_SHOWN_CHARS))}</pre></div>
<div><h3>Draft</h3>
<p class="summary">${escapeHtml(summary)}</p><p class="tags">${escapeHtml(tags)}</p>
<form method="post" action="/decide" class="approve">${hidden('approve')}<button>Approve</button></form>
<form method="post" action="/decide" class="edit">${hidden('edit')}
<label>Summary <textarea name="summary" rows="4" required>${escapeHtml(summary)}</textarea></label>
<label>Tags <input name="tags" value="${escapeHtml(tags)}"></label><button>Publish edited</button></form>
<form method="post" action="/decide" class="reject">${hidden('reject')}
<label>Reason <input name="reason" required maxlength="2000"></label><button>Reject</button></form>
</div></div></section>`;
      }),
    );
    const note = said === undefined ? '' : `<p class="said">${escapeHtml(said)}</p>`;
    const unanswered = queue.unanswered ?? [];
    const failed = queue.failed ?? [];
    const waiting =
      (unanswered.length === 0
        ? ''
        : `<p class="said">${unanswered.length} more await review, but no worker answered for their drafts: ` +
          'start one (npm run worker) and reload.</p>') +
      failed
        .map(
          ({ workflowId, error }) =>
            `<p class="failed">${escapeHtml(workflowId)} awaits review, but its draft could not be read: ` +
            `${escapeHtml(error)}</p>`,
        )
        .join('');
    const body =
      cards.length === 0 && waiting === ''
        ? '<p>Nothing awaits review.</p>'
        : `${waiting}${cards.join('\n')}`;
    return page(`Review (${queue.length + unanswered.length + failed.length})`, `${note}\n${body}`);
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const address = server.address();
  const bound = address !== null && typeof address === 'object' ? address.port : port;
  origin = `http://${host.includes(':') ? `[${host}]` : host}:${bound}`;
  return { url: `${origin}/`, close: () => closeServer(server) };
}

/** Why a POST is refused as cross-site, from what the browser says of its origin; undefined when it is not. */
function crossSite(req: http.IncomingMessage, origin: string): string | undefined {
  const site = req.headers['sec-fetch-site'];
  if (site !== undefined && site !== 'same-origin' && site !== 'none')
    return `a decision sent from another site (${site}) is refused`;
  const from = req.headers.origin;
  const host = req.headers.host;
  if (from !== undefined && from !== origin && from !== `http://${host ?? ''}`)
    return `a decision sent from ${from} is refused: only this page may send one`;
  return undefined;
}

function authorized(header: string | undefined, token: string): boolean {
  const match = /^Basic ([A-Za-z0-9+/=]+)$/.exec(header ?? '');
  if (match === null) return false;
  const decoded = Buffer.from(match[1] ?? '', 'base64').toString('utf8');
  return sameToken(decoded.slice(decoded.indexOf(':') + 1), token);
}

/** Compares in constant time (the digests have one length whatever was sent). */
function sameToken(given: string, expected: string): boolean {
  const digest = (s: string): Buffer => createHash('sha256').update(s).digest();
  return timingSafeEqual(digest(given), digest(expected));
}

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function send(res: http.ServerResponse, status: number, html: string): void {
  res
    .writeHead(status, {
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
form { margin: .5rem 0; } label { display: block; margin: .25rem 0; } textarea, input { width: 100%; }
</style></head><body><h1>${escapeHtml(title)}</h1>
${body}
</body></html>`;
}
