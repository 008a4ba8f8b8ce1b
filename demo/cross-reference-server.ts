/**
 * The demo's receiver of cross-references (the related step's changing tool, activities/related/): a loopback
 * HTTP endpoint that files each POST once per Idempotency-Key and answers a repeat with the first receipt, as a
 * receiver that dedupes does. Its log of requests and effects is what the tests count: a retry after a crash sends
 * the same key, and the effects stay one a call.
 */
import http from 'node:http';
import { closeServer, listenOnLoopback, readBody } from '../src/lib/loopback';

export interface CrossReferenceServer {
  /** For AGENT_TOOL_URL. */
  url: string;
  /** Every POST received, with its key (repeats included). */
  requests: { key: string | undefined; body: unknown }[];
  /** Cross-references filed: one per key. */
  effects: { key: string; receipt: string; body: unknown }[];
  /**
   * Called once a POST is filed, before its answer is sent: a test SIGKILLs the worker here, so the effect has
   * happened and the worker never hears of it. The answer waits for what it returns.
   */
  afterEffect?: (key: string) => Promise<void> | void;
  close(): Promise<void>;
}

/** Starts the receiver on loopback. */
export async function startCrossReferenceServer(): Promise<CrossReferenceServer> {
  const filed = new Map<string, string>();
  const state: CrossReferenceServer = {
    url: '',
    requests: [],
    effects: [],
    close: () => closeServer(server),
  };
  const server = http.createServer((req, res) => {
    void (async () => {
      const raw = await readBody(req);
      const key = req.headers['idempotency-key'];
      const keyOf = typeof key === 'string' && key !== '' ? key : undefined;
      let body: unknown;
      try {
        body = JSON.parse(raw.toString('utf8'));
      } catch {
        res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":"the body is not JSON"}');
        return;
      }
      state.requests.push({ key: keyOf, body });
      if (req.method !== 'POST' || keyOf === undefined) {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end('{"error":"POST a cross-reference with an Idempotency-Key header"}');
        return;
      }
      const known = filed.get(keyOf);
      const receipt = known ?? `xref-${filed.size + 1}`;
      if (known === undefined) {
        filed.set(keyOf, receipt);
        state.effects.push({ key: keyOf, receipt, body });
        await state.afterEffect?.(keyOf);
      }
      res.writeHead(known === undefined ? 201 : 200, {
        'content-type': 'application/json',
        'idempotency-key': keyOf,
      });
      res.end(JSON.stringify({ receipt, duplicate: known !== undefined }));
    })();
  });
  state.url = `${await listenOnLoopback(server, 'cross-reference server')}/cross-references`;
  return state;
}
