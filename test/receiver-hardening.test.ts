/**
 * Review issue 31, case 13 and the configuration half of case 3: the publish target's refusals cost one log line
 * (a malformed percent-encoding, an unsigned lookup, an over-large body), the HTTP client reads an answer only up
 * to a cap, a malformed PUBLISH_WEBHOOK_LOOKUP_URL stops the start with what to fix, and the lookup answers in
 * the documented shape (a query string ignored, the key named, an unknown route's 404 told apart).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { ConfigError, loadConfig } from '../src/config';
import { getJson, MAX_ANSWER_BYTES, postJson } from '../src/lib/http';
import { closeServer, listenOnLoopback } from '../src/lib/loopback';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import type { PublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import type { ReceiverOptions } from '../src/publisher/receiver';
import { signer } from '../src/publisher/signature';
import type { Publication } from '../src/publisher/types';
import { deliveryOf } from '../src/publisher/webhook-publisher';
import { scratchLedger, webhookPublisher } from './helpers';
import { rawRequest } from './raw-http';
import type { RawAnswer } from './raw-http';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();

function newSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

function publication(documentId = `doc-${randomUUID()}`): Publication {
  return {
    documentId,
    title: 'A title',
    textRef: `sha256:${'b'.repeat(64)}`,
    summary: 'A summary.',
    tags: ['checkpoints'],
    model: { provider: 'offline', model: 'extractive-wink-nlp' },
  };
}

/** A receiver over a fresh SQLite store, both closed after the file's tests. */
async function target(options: ReceiverOptions = {}): Promise<{ url: string; store: PublicationStore }> {
  const store = new SqlitePublicationStore(path.join(scratchDir(defer, 'receiver-hardening-'), 'pub.db'));
  defer(() => store.close());
  const receiver = await startReceiver(store, options);
  defer(() => receiver.close());
  return { url: receiver.url, store };
}

/**
 * Sends one request with exactly this target path (a malformed percent-encoding goes out as written) and reads the
 * whole answer; gives up after 5 s.
 */
function send(
  method: 'GET' | 'POST',
  url: string,
  requestPath: string,
  headers: Record<string, string> = {},
  body = '',
): Promise<RawAnswer> {
  return rawRequest(method, url, { path: requestPath, headers, body });
}

/** Runs `action` with console.error collected instead of printed, and returns what it logged. */
async function logged<T>(action: () => Promise<T>): Promise<{ result: T; lines: string[] }> {
  const original = console.error;
  const lines: string[] = [];
  console.error = (...args: unknown[]) =>
    void lines.push(args.map((a) => (a instanceof Error ? (a.stack ?? a.message) : String(a))).join(' '));
  try {
    return { result: await action(), lines };
  } finally {
    console.error = original;
  }
}

/** One line, short, with no stack frame in it. */
function assertOneLine(lines: string[], pattern: RegExp): void {
  assert.equal(
    lines.length,
    1,
    `expected one log line, got ${lines.length}: ${lines.join(' | ').slice(0, 500)}`,
  );
  const [line = ''] = lines;
  assert.ok(!line.includes('\n'), `the log line spans lines: ${line.slice(0, 500)}`);
  assert.ok(!/\bat .*:\d+:\d+/.test(line), `the log line carries a stack: ${line.slice(0, 500)}`);
  assert.ok(line.length < 400, `the log line is ${line.length} characters`);
  assert.match(line, pattern);
}

describe('publish target: a refusal costs one log line, never a stack', () => {
  it('checks the signature before decoding the lookup key: an unsigned malformed percent-encoding is a 401, a signed one a 400', async () => {
    const secret = newSecret();
    const { url } = await target({ secret });

    const unsigned = await logged(() => send('GET', url, '/publications/%E0%A4%A'));
    assert.equal(unsigned.result.status, 401, unsigned.result.body);
    assertOneLine(unsigned.lines, /^publish target: 401 to GET "\/publications\/%E0%A4%A": /);

    const signed = await logged(() =>
      send('GET', url, '/publications/%E0%A4%A', signer(secret)('some-key', '')),
    );
    assert.equal(signed.result.status, 400, signed.result.body);
    assert.match(JSON.parse(signed.result.body).error, /not valid percent-encoded UTF-8/);
    assertOneLine(signed.lines, /400 to GET .*not valid percent-encoded UTF-8/);
  });

  it('answers a malformed percent-encoding on an unsigned loopback target with 400 and one line', async () => {
    const { url } = await target();
    for (const bad of ['%E0%A4%A', '%', '%zz', '%C0%AF']) {
      const { result, lines } = await logged(() => send('GET', url, `/publications/${bad}`));
      assert.equal(result.status, 400, `${bad}: ${result.body}`);
      assertOneLine(lines, /400 to GET .*not valid percent-encoded UTF-8/);
    }
    // And it still serves.
    assert.equal((await send('GET', url, '/publications/unknown-key')).status, 404);
  });

  it('refuses a key with control characters (a NUL, which PostgreSQL cannot store) with 400, not a store failure', async () => {
    const { url } = await target();
    const lookup = await logged(() => send('GET', url, '/publications/a%00b'));
    assert.equal(lookup.result.status, 400, lookup.result.body);
    assertOneLine(lookup.lines, /must not contain control characters/);

    const body = JSON.stringify({ ...publication(), summary: 'nul \u0000 inside' });
    const nul = await logged(() =>
      send(
        'POST',
        url,
        '/publications',
        { 'content-type': 'application/json', 'idempotency-key': 'k-nul' },
        body,
      ),
    );
    assert.equal(nul.result.status, 400, nul.result.body);
    assertOneLine(nul.lines, /NUL/);
  });

  it('refuses a POST over its body cap with 413 and one log line, and keeps serving', async () => {
    const { url, store } = await target({ maxBodyBytes: 4096 });
    const declared = await logged(() =>
      send(
        'POST',
        url,
        '/publications',
        { 'content-type': 'application/json', 'idempotency-key': 'big', 'content-length': String(1 << 20) },
        ' '.repeat(1 << 20),
      ).catch((err: unknown) => ({ status: -1, body: String(err) })),
    );
    assert.equal(declared.result.status, 413, declared.result.body);
    assertOneLine(
      declared.lines,
      /^publish target: 413 to POST "\/publications": the body is over 4096 bytes$/,
    );

    // Chunked, no length given: cut at the cap.
    const streamed = await logged(() =>
      send(
        'POST',
        url,
        '/publications',
        { 'content-type': 'application/json', 'idempotency-key': 'big', 'transfer-encoding': 'chunked' },
        ' '.repeat(64 * 1024),
      ).catch((err: unknown) => ({ status: -1, body: String(err) })),
    );
    assert.equal(streamed.result.status, 413, streamed.result.body);
    assertOneLine(streamed.lines, /413 to POST .*over 4096 bytes/);
    assert.deepEqual(await store.deliveries(), []);
    const small = await send(
      'POST',
      url,
      '/publications',
      { 'content-type': 'application/json', 'idempotency-key': 'small' },
      JSON.stringify(publication()),
    );
    assert.equal(small.status, 201, small.body);
  });
});

/**
 * A server answering every request with `total` bytes of 'x', made as they are sent (never held), counting what
 * it wrote; `closed` settles when its answer's connection ends, read to the end or cut off.
 */
async function endlessServer(total: number): Promise<{
  url: string;
  written: () => number;
  closed: () => Promise<void>;
}> {
  let written = 0;
  let ended: Promise<void> = Promise.resolve();
  const chunk = Buffer.alloc(64 * 1024, 'x');
  const server = http.createServer((req, res) => {
    req.resume();
    ended = new Promise((resolve) => res.once('close', () => resolve()));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(total) });
    const pump = (): void => {
      while (written < total && !res.destroyed) {
        const piece = chunk.subarray(0, Math.min(chunk.length, total - written));
        written += piece.length;
        if (!res.write(piece)) {
          res.once('drain', pump);
          return;
        }
      }
      if (written >= total) res.end();
    };
    pump();
  });
  const origin = await listenOnLoopback(server, 'endless answer');
  defer(() => closeServer(server));
  return {
    url: `${origin}/answer`,
    written: () => written,
    closed: () =>
      Promise.race([
        ended,
        new Promise<void>((_, reject) =>
          setTimeout(() => reject(new Error('the answer was still being sent after 5 s')), 5_000).unref(),
        ),
      ]),
  };
}

describe('HTTP client: an answer is read up to a cap', () => {
  const GIB = 1024 * 1024 * 1024;

  for (const method of ['GET', 'POST'] as const) {
    it(`${method}: stops reading a 1 GiB answer at ${MAX_ANSWER_BYTES} bytes, marks it truncated, and drops the connection`, async () => {
      const far = await endlessServer(GIB);
      const before = process.memoryUsage();
      const options = { headers: {}, timeoutMs: 10_000, signal: new AbortController().signal };
      const answer =
        method === 'GET'
          ? await getJson(far.url, options)
          : await postJson(far.url, { hello: 'receiver' }, { ...options, what: 'test', transientType: 'T' });
      await far.closed();
      const after = process.memoryUsage();

      assert.equal(answer.status, 200);
      assert.equal(answer.truncated, true);
      assert.equal(answer.body.length, MAX_ANSWER_BYTES);
      assert.ok(/^x+$/.test(answer.body));
      // Socket buffers hold a few MiB past what was read; never the gigabyte.
      assert.ok(
        far.written() < 64 * 1024 * 1024,
        `the server wrote ${far.written()} bytes before the client hung up`,
      );
      const grew = after.rss - before.rss;
      assert.ok(grew < 64 * 1024 * 1024, `RSS grew ${grew} bytes`);
    });
  }

  it('reads an answer of exactly the cap whole, not truncated; one byte more is truncated', async () => {
    const options = {
      headers: {},
      timeoutMs: 5_000,
      signal: new AbortController().signal,
      maxBodyBytes: 1000,
    };
    const exact = await getJson((await endlessServer(1000)).url, options);
    assert.deepEqual([exact.body.length, exact.truncated], [1000, false]);
    const over = await getJson((await endlessServer(1001)).url, options);
    assert.deepEqual([over.body.length, over.truncated], [1000, true]);
  });
});

describe('PUBLISH_WEBHOOK_LOOKUP_URL: refused at start-up when malformed, with what to fix', () => {
  const refused: [string, RegExp][] = [
    ['https://receiver.example.com/publications/{key}/', /must not end its path with "\/".*no such route/],
    ['https://receiver.example.com/publications/{key}?token={key}', /must have \{key\} once/],
    ['https://receiver.example.com/publications?key={key}', /in the path, not in the query string.*\?token=/],
    ['https://{key}.receiver.example.com/publications', /in the path, not in the host/],
    ['https://receiver.example.com/publications#{key}', /must not have a fragment.*put \{key\} in the path/],
    ['https://receiver.example.com/publications/{key}#top', /must not have a fragment/],
    ['https://receiver.example.com/publications/key-{key}', /as a whole path segment/],
    ['https://receiver.example.com/publications/{key}.json', /as a whole path segment/],
    ['https://receiver.example.com/publications', /must have \{key\} where the Idempotency-Key goes/],
    ['receiver.example.com/publications/{key}', /absolute http\(s\) URL/],
    ['ftp://receiver.example.com/publications/{key}', /absolute http\(s\) URL/],
    ['https://user:pw@receiver.example.com/publications/{key}', /user name or password/],
  ];
  for (const [url, problem] of refused) {
    it(`refuses ${url}`, () => {
      assert.throws(
        () => loadConfig({ PUBLISH_WEBHOOK_LOOKUP_URL: url }),
        (err: unknown) =>
          err instanceof ConfigError &&
          /PUBLISH_WEBHOOK_LOOKUP_URL: /.test(err.message) &&
          problem.test(err.message) &&
          /e\.g\.|PUBLISH_WEBHOOK_SECRET|remove it/.test(err.message),
      );
    });
  }

  it('takes {key} as a whole path segment, with a query string of its own, a port, more path after it', () => {
    for (const url of [
      'https://receiver.example.com/publications/{key}',
      'https://receiver.example.com/publications/{key}?token=s3cr3t&v=2',
      'http://127.0.0.1:8787/publications/{key}',
      'https://receiver.example.com/api/{key}/status',
      'https://receiver.example.com/{key}',
    ]) {
      assert.equal(loadConfig({ PUBLISH_WEBHOOK_LOOKUP_URL: url }).publishLookupUrl, url);
    }
    assert.equal(loadConfig({ PUBLISH_WEBHOOK_LOOKUP_URL: '' }).publishLookupUrl, undefined);
  });
});

describe('publish target: the lookup by key answers in its documented shape', () => {
  it('200 names the key, document, revision and version; 404 names the key; a query string is ignored; an unknown route names no key', async () => {
    const { url } = await target();
    const doc = publication();
    const post = (requestPath: string, key: string, body: Publication): Promise<RawAnswer> =>
      send(
        'POST',
        url,
        requestPath,
        { 'content-type': 'application/json', 'idempotency-key': key },
        JSON.stringify(body),
      );
    assert.equal((await post('/publications', 'run-1:publish', doc)).status, 201);

    const found = await send('GET', url, '/publications/run-1%3Apublish');
    assert.equal(found.status, 200, found.body);
    assert.deepEqual(JSON.parse(found.body), {
      idempotencyKey: 'run-1:publish',
      documentId: doc.documentId,
      revision: 1,
      textRef: doc.textRef,
    });
    const missing = await send('GET', url, '/publications/run-2%3Apublish');
    assert.equal(missing.status, 404);
    assert.deepEqual(JSON.parse(missing.body), { idempotencyKey: 'run-2:publish', found: false });

    // A query string (a token for a proxy in front, say) is no part of the route.
    const withToken = await send('GET', url, '/publications/run-1:publish?token=abc');
    assert.equal(withToken.status, 200, withToken.body);
    assert.deepEqual(JSON.parse(withToken.body), JSON.parse(found.body));
    const missingWithToken = await send('GET', url, '/publications/run-2:publish?token=abc');
    assert.deepEqual(JSON.parse(missingWithToken.body), JSON.parse(missing.body));
    assert.equal((await post('/publications?token=abc', 'run-3:publish', publication())).status, 201);

    const routes = [
      '/publications/run-1:publish/',
      '/publications/',
      '/elsewhere/run-1:publish?token=s3cr3t',
    ];
    for (const route of routes) {
      const { result: wrong, lines } = await logged(() => send('GET', url, route));
      assert.equal(wrong.status, 404, route);
      const body = JSON.parse(wrong.body) as Record<string, unknown>;
      assert.equal(body.idempotencyKey, undefined, `${route}: ${wrong.body}`);
      assert.match(String(body.error), /no such route/);
      assertOneLine(lines, /404 to GET .*no such route/);
      assert.ok(!lines.join('').includes('s3cr3t'), `a query string's token was logged: ${lines.join('')}`);
    }
  });

  it('settles a lost answer through a lookup URL carrying ?token=, without a second POST', async () => {
    const { url, store } = await target();
    const ledger = scratchLedger(defer);
    const doc = publication();
    // The first POST landed, but its answer never came back: the claim stays open.
    await ledger.claim(deliveryOf(doc, 'run-1:publish', 2_000), 'dead-worker');
    await store.publish(doc, 'run-1:publish');
    const lookupUrl = `${url}/{key}?token=abc`;
    assert.equal(loadConfig({ PUBLISH_WEBHOOK_LOOKUP_URL: lookupUrl }).publishLookupUrl, lookupUrl);
    const publisher = webhookPublisher(defer, url, { lookupUrl, timeoutMs: 2_000, ledger, policy: 'hold' });

    const receipt = await publisher.publish(doc, 'run-1:publish', new AbortController().signal);

    assert.deepEqual([receipt.revision, receipt.duplicate], [1, true]);
    assert.deepEqual(await ledger.openClaims(), []);
    // Only the first delivery reached the store: the lookup answered, nothing was POSTed again.
    assert.deepEqual(
      (await store.deliveries()).map((d) => d.outcome),
      ['created'],
    );
  });
});
