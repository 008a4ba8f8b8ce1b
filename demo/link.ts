/**
 * The network between a worker and its publish target, made visible: an HTTP relay on loopback that forwards
 * each POST (with its Idempotency-Key) to the target and the answer back, slowly when asked, and that can hold
 * requests as a partition would. The demo uses it to land a crash between "the target committed" and "the worker
 * heard back"; tests use it to keep a step in flight, or to deliver a zombie's request late.
 */
import http from 'node:http';
import { closeServer, listenOnLoopback, readBody } from '../src/lib/loopback';

/** A request that reached the link. */
export interface LinkRequest {
  key: string | undefined;
  body: Buffer;
}

export interface LinkOptions {
  /** True to hold the request: never forwarded, never answered, until `release()` delivers it late. */
  hold?: (request: LinkRequest) => boolean;
  /** True to forward the request (the target commits it) but never send the answer back: a reply lost in a crash. */
  holdReply?: (request: LinkRequest) => boolean;
}

export interface Link {
  /** For PUBLISH_WEBHOOK_URL. */
  url: string;
  /** Requests forwarded to the target. */
  passed: LinkRequest[];
  /** Requests held back (released ones stay listed). */
  held: LinkRequest[];
  /** Delivers the held requests not yet released to the target now, as a zombie's would arrive late; returns its answers. */
  release(): Promise<{ status: number; body: string }[]>;
  close(): Promise<void>;
}

/** POSTs a request on to `targetUrl` with its Idempotency-Key, and returns the answer. */
export async function relay(
  targetUrl: string,
  { key, body }: LinkRequest,
): Promise<{ status: number; body: string; echoedKey: string | null }> {
  const answer = await fetch(targetUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key !== undefined ? { 'idempotency-key': key } : {}) },
    body,
  });
  return {
    status: answer.status,
    body: await answer.text(),
    echoedKey: answer.headers.get('idempotency-key'),
  };
}

/** Starts a link to `targetUrl` on a free loopback port. */
export async function startLink(
  targetUrl: string,
  { hold = () => false, holdReply = () => false }: LinkOptions = {},
): Promise<Link> {
  const passed: LinkRequest[] = [];
  const held: LinkRequest[] = [];
  let released = 0;
  const forward = (request: LinkRequest) => relay(targetUrl, request);
  const server = http.createServer((req, res) => {
    const relay = async (): Promise<void> => {
      const header = req.headers['idempotency-key'];
      const request = { key: typeof header === 'string' ? header : undefined, body: await readBody(req) };
      if (hold(request)) {
        held.push(request);
        return;
      }
      passed.push(request);
      const answer = await forward(request);
      if (holdReply(request)) return;
      if (res.destroyed) return;
      // The target's echo of the key passes through: it tells the sender that the target dedupes.
      const echo: Record<string, string> =
        answer.echoedKey === null ? {} : { 'idempotency-key': answer.echoedKey };
      res.writeHead(answer.status, { 'content-type': 'application/json', ...echo });
      res.end(answer.body);
    };
    relay().catch((err: unknown) => {
      if (res.destroyed) return;
      res.writeHead(502, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: `link: ${String(err)}` }));
    });
  });
  const origin = await listenOnLoopback(server, 'link');
  return {
    url: `${origin}/publications`,
    passed,
    held,
    release: async () => {
      const answers = [];
      while (released < held.length) {
        const request = held[released++];
        if (request !== undefined) answers.push(await forward(request));
      }
      return answers;
    },
    close: () => closeServer(server),
  };
}
