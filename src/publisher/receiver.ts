import http from 'node:http';
import { describeIssues, PublishInputSchema } from '../contract';
import type { PublicationStore } from './publication-store';

export interface Receiver {
  url: string;
  close(): Promise<void>;
}

/**
 * A real publish target over HTTP: `POST /publications` with an `Idempotency-Key` header, backed by a
 * PublicationStore. Point PUBLISH_WEBHOOK_URL at it; tests use it as the far side of the webhook publisher.
 * Answers 201 for a new revision, 200 for a key it has seen (with the first receipt), 200 with `superseded: true`
 * and the current revision for a new key from a run older than the published one (not written), 400 for bad
 * requests.
 */
export async function startReceiver(
  store: PublicationStore,
  { host = '127.0.0.1', port = 0 }: { host?: string; port?: number } = {},
): Promise<Receiver> {
  const server = http.createServer((req, res) => {
    const reply = (status: number, body: unknown, headers: Record<string, string> = {}): void => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify(body));
    };
    if (req.method !== 'POST' || req.url !== '/publications') {
      reply(404, { error: 'POST /publications is the only route' });
      return;
    }
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const key = req.headers['idempotency-key'];
      if (typeof key !== 'string' || key.trim() === '') {
        reply(400, { error: 'the Idempotency-Key header is required' });
        return;
      }
      let body: unknown;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        reply(400, { error: 'the body must be JSON' });
        return;
      }
      const parsed = PublishInputSchema.safeParse(body);
      if (!parsed.success) {
        reply(400, { error: `invalid publication: ${describeIssues(parsed.error)}` });
        return;
      }
      store.publish(parsed.data, key).then(
        // Echoing the key tells the sender this receiver dedupes by it, so a lost answer may be sent again.
        (receipt) =>
          reply(receipt.duplicate || receipt.superseded === true ? 200 : 201, receipt, {
            'idempotency-key': key,
          }),
        (err: unknown) => reply(503, { error: `the publication store failed: ${String(err)}` }),
      );
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('receiver did not bind a TCP port');
  return {
    url: `http://${host}:${address.port}/publications`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
