/**
 * The HTTP publish target against hostile senders: unsigned, forged and replayed requests, a Host it was not
 * given, a scheduledAt that would pin a document forever, a body far over the cap, a store that fails. Each is
 * refused with its status and the target keeps serving the real sender (the webhook publisher, which signs).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { ApplicationFailure } from '@temporalio/common';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import type { PublicationStore } from '../src/publisher/publication-store';
import { MAX_BODY_BYTES, SCHEDULE_SKEW_MS, startReceiver } from '../src/publisher/receiver';
import type { ReceiverOptions } from '../src/publisher/receiver';
import { SIGNATURE_TOLERANCE_SECONDS, signer } from '../src/publisher/signature';
import type { Publication } from '../src/publisher/types';
import { FailureType } from '../src/contract';
import { scratchLedger, webhookPublisher } from './helpers';
import { deliveryOf } from '../src/publisher/webhook-publisher';
import { rawRequest } from './raw-http';
import type { RawAnswer } from './raw-http';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
const NO_ABORT = new AbortController().signal;

function newSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

function freshStore(): PublicationStore {
  const store = new SqlitePublicationStore(
    path.join(scratchDir(defer, 'publish-target-'), 'publications.db'),
  );
  defer(() => store.close());
  return store;
}

function publication(documentId = `doc-${randomUUID()}`, scheduledAt?: number): Publication {
  return {
    documentId,
    title: 'A title',
    textRef: `sha256:${'a'.repeat(64)}`,
    summary: 'A summary.',
    tags: ['checkpoints'],
    model: { provider: 'offline', model: 'extractive-wink-nlp' },
    ...(scheduledAt === undefined ? {} : { scheduledAt }),
  };
}

/** A receiver over `store` (a fresh one by default), closed after the file's tests. */
async function target(
  options: ReceiverOptions = {},
  store = freshStore(),
): Promise<{ url: string; store: PublicationStore }> {
  const receiver = await startReceiver(store, options);
  defer(() => receiver.close());
  return { url: receiver.url, store };
}

/** POSTs `body` with exactly these headers (Host included, which fetch would not let a test set). */
function post(url: string, body: string, headers: Record<string, string> = {}): Promise<RawAnswer> {
  return send('POST', url, body, { 'content-type': 'application/json', ...headers });
}

/** Sends one request with exactly these headers and `body` (none for a GET), and reads the whole answer. */
function send(
  method: 'GET' | 'POST',
  url: string,
  body: string,
  headers: Record<string, string>,
): Promise<RawAnswer> {
  return rawRequest(method, url, { headers, body });
}

/** POSTs a publication under `key`, signed with `secret` at `now` as the webhook publisher would. */
function signedPost(
  url: string,
  secret: string,
  doc: Publication,
  key: string,
  { now = Date.now(), headers = {} }: { now?: number; headers?: Record<string, string> } = {},
): Promise<RawAnswer> {
  const body = JSON.stringify(doc);
  return post(url, body, { 'idempotency-key': key, ...signer(secret)(key, body, now), ...headers });
}

async function written(store: PublicationStore): Promise<string[]> {
  return (await store.deliveries()).map((d) => `${d.idempotencyKey}:${d.outcome}`);
}

describe('publish target: signatures', () => {
  it('refuses an unsigned request with 401 naming the missing headers, and stores nothing', async () => {
    const { url, store } = await target({ secret: newSecret() });
    const doc = publication();

    const unsigned = await post(url, JSON.stringify(doc), { 'idempotency-key': 'k1' });
    const noSignature = await post(url, JSON.stringify(doc), {
      'idempotency-key': 'k1',
      'webhook-id': 'k1',
      'webhook-timestamp': String(Math.floor(Date.now() / 1000)),
    });

    assert.equal(unsigned.status, 401);
    assert.match(unsigned.body, /webhook-id, webhook-timestamp, webhook-signature headers are missing/);
    assert.equal(noSignature.status, 401);
    assert.match(noSignature.body, /the webhook-signature header is missing/);
    assert.deepEqual(await written(store), []);
  });

  it('refuses forged signatures: another secret, an altered body, a signed request replayed under a new key', async () => {
    const secret = newSecret();
    const { url, store } = await target({ secret });
    const doc = publication();
    const body = JSON.stringify(doc);
    const genuine = signer(secret)('k1', body);

    const otherSecret = await signedPost(url, newSecret(), doc, 'k1');
    const altered = await post(url, JSON.stringify({ ...doc, summary: 'Forged.' }), {
      'idempotency-key': 'k1',
      ...genuine,
    });
    const newKey = await post(url, body, { 'idempotency-key': 'k2', ...genuine });
    const garbage = await post(url, body, {
      'idempotency-key': 'k1',
      ...genuine,
      'webhook-signature': 'v1,AAAA v2,whatever',
    });

    for (const answer of [otherSecret, altered, garbage]) {
      assert.equal(answer.status, 401, answer.body);
      assert.match(answer.body, /webhook-signature does not match the body/);
    }
    assert.equal(newKey.status, 401);
    assert.match(newKey.body, /webhook-id header must equal the Idempotency-Key/);
    assert.deepEqual(await written(store), []);
  });

  it('refuses a replay from outside the tolerance; inside it the key makes it a harmless duplicate', async () => {
    const secret = newSecret();
    const { url, store } = await target({ secret });
    const doc = publication();
    const outside = Date.now() - (SIGNATURE_TOLERANCE_SECONDS + 60) * 1000;

    const first = await signedPost(url, secret, doc, 'k1');
    const replayed = await signedPost(url, secret, doc, 'k1');
    const stale = await signedPost(url, secret, publication(doc.documentId), 'k-old', { now: outside });
    const future = await signedPost(url, secret, publication(doc.documentId), 'k-new', {
      now: Date.now() + (SIGNATURE_TOLERANCE_SECONDS + 60) * 1000,
    });

    assert.deepEqual([first.status, replayed.status], [201, 200]);
    assert.equal(JSON.parse(replayed.body).duplicate, true);
    for (const answer of [stale, future]) {
      assert.equal(answer.status, 401);
      assert.match(answer.body, /webhook-timestamp is \d+ s away from this receiver's clock/);
    }
    assert.deepEqual(await written(store), ['k1:created', 'k1:duplicate']);
  });

  it('takes what the webhook publisher signs; an unsigned or wrongly signed publisher is rejected without retry', async () => {
    const secret = newSecret();
    const { url, store } = await target({ secret });
    const doc = publication();

    const receipt = await webhookPublisher(defer, url, { secret }).publish(doc, 'run-1:publish', NO_ABORT);
    const rejected = (publisher: ReturnType<typeof webhookPublisher>, because: RegExp) =>
      assert.rejects(publisher.publish(publication(), 'run-2:publish', NO_ABORT), (err: unknown) => {
        assert.ok(err instanceof ApplicationFailure);
        assert.equal(err.type, FailureType.PublishRejected);
        assert.equal(err.nonRetryable, true);
        assert.match(err.message, because);
        return true;
      });

    assert.deepEqual(receipt, {
      documentId: doc.documentId,
      revision: 1,
      duplicate: false,
      receiverHonoursKey: true,
    });
    await rejected(webhookPublisher(defer, url), /HTTP 401: .*webhook-signature headers are missing/);
    await rejected(webhookPublisher(defer, url, { secret: newSecret() }), /HTTP 401: .*does not match/);
    assert.deepEqual(await written(store), ['run-1:publish:created']);
  });

  it('will not listen beyond loopback without a secret, naming PUBLISH_WEBHOOK_SECRET; with one it does', async () => {
    const store = freshStore();

    // Closed at once should it start after all, so a failure here cannot leave the file's process running.
    const start = (options: ReceiverOptions) =>
      startReceiver(store, options).then(async (receiver) => void (await receiver.close()));

    await assert.rejects(start({ host: '0.0.0.0' }), /PUBLISH_WEBHOOK_SECRET/);
    await assert.rejects(start({ host: '0.0.0.0', secret: 'hunter2' }), /whsec_/);
    const secret = newSecret();
    const { url } = await target({ host: '0.0.0.0', secret }, store);
    const port = new URL(url).port;

    const answer = await signedPost(`http://127.0.0.1:${port}/publications`, secret, publication(), 'k1');
    assert.equal(answer.status, 201, answer.body);
  });
});

describe('publish target: Host, scheduledAt, body size, store errors', () => {
  it('answers 421 to a Host it was not given (a DNS-rebinding page), and serves its own names', async () => {
    const { url, store } = await target();
    const { port } = new URL(url);
    const as = (host: string, key: string) =>
      post(url, JSON.stringify(publication()), { host, 'idempotency-key': key });
    const secret = newSecret();
    const wide = await target({ host: '0.0.0.0', secret, hostnames: ['publish-target'] });
    const widePort = new URL(wide.url).port;
    const wideAs = (host: string, key: string) =>
      signedPost(`http://127.0.0.1:${widePort}/publications`, secret, publication(), key, {
        headers: { host },
      });

    const refused = [
      await as(`rebound.attacker.example:${port}`, 'k1'),
      await as(`127.0.0.1:${Number(port) + 1}`, 'k2'),
      await as('127.0.0.1', 'k3'),
      await wideAs(`attacker.example:${widePort}`, 'k4'),
    ];
    const served = [
      await as(`127.0.0.1:${port}`, 'k5'),
      await as(`localhost:${port}`, 'k6'),
      await wideAs(`publish-target:${widePort}`, 'k7'),
    ];

    assert.deepEqual(
      refused.map((a) => a.status),
      [421, 421, 421, 421],
    );
    assert.match(
      JSON.parse(refused[0]?.body ?? '{}').error,
      /does not answer to Host "rebound\.attacker\.example:\d+"/,
    );
    assert.deepEqual(
      served.map((a) => a.status),
      [201, 201, 201],
    );
    assert.deepEqual(await written(store), ['k5:created', 'k6:created']);
  });

  it('refuses a scheduledAt beyond its clock plus the skew allowance, so the document is not pinned', async () => {
    const secret = newSecret();
    const { url, store } = await target({ secret });
    const documentId = `doc-${randomUUID()}`;

    // The probe's attack, now with a valid signature: a run "scheduled" at the end of time.
    const pin = await signedPost(url, secret, publication(documentId, Number.MAX_SAFE_INTEGER), 'pin');
    const slightlyAhead = await signedPost(
      url,
      secret,
      publication(documentId, Date.now() + 60_000),
      'ahead',
    );
    const later = await signedPost(url, secret, publication(documentId, Date.now() + 120_000), 'later');
    const justOver = await signedPost(
      url,
      secret,
      publication(documentId, Date.now() + SCHEDULE_SKEW_MS + 60_000),
      'over',
    );

    assert.equal(pin.status, 400);
    assert.match(pin.body, /scheduledAt is \d+ s ahead of this receiver's clock .* outrank every later run/);
    assert.equal(justOver.status, 400);
    // A clock a minute fast still publishes, and the next run still supersedes it.
    assert.deepEqual([slightlyAhead.status, later.status], [201, 201]);
    assert.deepEqual(await written(store), ['ahead:created', 'later:created']);
    assert.equal((await store.currentPublication(documentId))?.revision, 2);
  });

  it('answers a 64 MiB body with 413 after at most the cap, and the process grows far less than the body', async () => {
    const { url, store } = await target();
    const total = 64 * 1024 * 1024;
    const before = process.memoryUsage();

    const streamed = await upload(url, total, { 'idempotency-key': 'big' });
    // Declared too large: answered from the headers, before a byte of body is sent.
    const declared = await upload(
      url,
      total,
      { 'idempotency-key': 'big', 'content-length': String(total) },
      0,
    );
    const after = process.memoryUsage();

    assert.deepEqual([streamed.status, declared.status], [413, 413]);
    assert.match(streamed.body, /over 1048576 bytes/);
    assert.equal(declared.sent, 0);
    // The upload stops soon after the cap (socket buffers hold a few MiB more), far short of 64 MiB.
    assert.ok(streamed.sent < total / 4, `the client sent ${streamed.sent} bytes before the target hung up`);
    const grewRss = after.rss - before.rss;
    const grewHeap = after.heapUsed + after.arrayBuffers - (before.heapUsed + before.arrayBuffers);
    assert.ok(grewRss < 16 * 1024 * 1024, `RSS grew ${grewRss} bytes for a ${total}-byte body`);
    assert.ok(grewHeap < 8 * MAX_BODY_BYTES, `heap and buffers grew ${grewHeap} bytes`);
    assert.deepEqual(await written(store), []);
    // And it still serves.
    const next = await post(url, JSON.stringify(publication()), { 'idempotency-key': 'small' });
    assert.equal(next.status, 201);
  });

  it('answers 500 JSON when the store throws or rejects, and keeps serving', async () => {
    const real = freshStore();
    let failure: 'throw' | 'reject' | undefined = 'throw';
    const failing: PublicationStore = {
      where: 'a store that fails on purpose',
      publish: (doc, key) => {
        if (failure === 'throw') throw new Error('SQLITE_IOERR: disk I/O error');
        if (failure === 'reject') return Promise.reject(new Error('connection terminated'));
        return real.publish(doc, key);
      },
      countPublications: () => real.countPublications(),
      currentPublication: (id) => real.currentPublication(id),
      revisionsOf: (id) => real.revisionsOf(id),
      deliveries: () => real.deliveries(),
      revisionOfKey: (key) => real.revisionOfKey(key),
      close: () => real.close(),
    };
    const { url } = await target({}, failing);
    const doc = JSON.stringify(publication());
    const quiet = silenceConsoleError();

    const thrown = await post(url, doc, { 'idempotency-key': 'k1' });
    failure = 'reject';
    const rejected = await post(url, doc, { 'idempotency-key': 'k1' });
    failure = undefined;
    const retried = await post(url, doc, { 'idempotency-key': 'k1' });
    quiet.restore();

    for (const answer of [thrown, rejected]) {
      assert.equal(answer.status, 500);
      assert.deepEqual(JSON.parse(answer.body), {
        error: 'the publication store failed; sending the same Idempotency-Key again is safe',
      });
    }
    assert.equal(retried.status, 201);
    assert.equal(quiet.lines.length, 2, 'each store failure is logged on the target');
  });
});

/**
 * Streams up to `total` bytes of body (chunked, unless a content-length header is given; at most `sendAtMost`)
 * without ever holding more than one 64 KiB chunk, until the target answers; returns its status and how much was
 * sent by then. Gives up after 10 s.
 */
function upload(
  url: string,
  total: number,
  headers: Record<string, string>,
  sendAtMost = total,
): Promise<RawAnswer & { sent: number }> {
  return new Promise((resolve, reject) => {
    const chunk = Buffer.alloc(64 * 1024, ' ');
    const req = http.request(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      signal: AbortSignal.timeout(10_000),
    });
    let sent = 0;
    let answered = false;
    req.on('response', (res) => {
      answered = true;
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        req.destroy();
        resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8'), sent });
      });
    });
    // Once answered, the target hanging up mid-upload is expected.
    req.on('error', (err) => {
      if (!answered) reject(err);
    });
    const pump = (): void => {
      while (sent < Math.min(total, sendAtMost) && !answered && !req.destroyed) {
        sent += chunk.length;
        if (!req.write(chunk)) {
          req.once('drain', pump);
          return;
        }
      }
      if (sent >= total) req.end();
    };
    req.flushHeaders();
    pump();
  });
}

/** Collects console.error lines (the target logs store failures) instead of printing them. */
function silenceConsoleError(): { lines: string[]; restore(): void } {
  const original = console.error;
  const lines: string[] = [];
  console.error = (...args: unknown[]) => void lines.push(args.map(String).join(' '));
  return { lines, restore: () => void (console.error = original) };
}

describe('publish target: refusing early', () => {
  /** Sends the head of a POST with these headers, announces a body of `length` bytes and sends none of it. */
  function headOnly(
    url: string,
    headers: Record<string, string>,
    length: number,
  ): Promise<RawAnswer | 'no answer'> {
    const { hostname, port } = new URL(url);
    return new Promise((resolve) => {
      const socket = net.connect(Number(port), hostname);
      let raw = '';
      const timer = setTimeout(() => {
        socket.destroy();
        resolve('no answer');
      }, 3_000);
      socket.on('data', (chunk: Buffer) => {
        raw += chunk.toString('utf8');
        const status = /^HTTP\/1\.1 (\d{3})/.exec(raw);
        if (status?.[1] !== undefined && raw.includes('\r\n\r\n')) {
          clearTimeout(timer);
          socket.destroy();
          resolve({ status: Number(status[1]), body: raw.slice(raw.indexOf('\r\n\r\n') + 4) });
        }
      });
      socket.on('error', () => undefined);
      const lines = Object.entries({
        host: `${hostname}:${port}`,
        'content-length': String(length),
        ...headers,
      });
      socket.write(
        `POST /publications HTTP/1.1\r\n${lines.map(([k, v]) => `${k}: ${v}`).join('\r\n')}\r\n\r\n`,
      );
    });
  }

  it(
    'refuses an unsigned, replayed or re-keyed request from its headers, before any of its body arrives',
    { timeout: 30_000 },
    async () => {
      const secret = newSecret();
      const { url, store } = await target({ secret });
      const signed = signer(secret)('k1', '{}');
      const cases: [string, Record<string, string>][] = [
        ['unsigned', { 'idempotency-key': 'k1' }],
        ['too old', { 'idempotency-key': 'k1', ...signer(secret)('k1', '{}', Date.now() - 3_600_000) }],
        ['re-keyed', { 'idempotency-key': 'k2', ...signed }],
      ];
      for (const [what, headers] of cases) {
        const answer = await headOnly(url, headers, 500_000);
        assert.ok(answer !== 'no answer', `${what}: the receiver waited for the body before refusing`);
        assert.equal(answer.status, 401, `${what}: ${answer.body}`);
      }
      assert.deepEqual(await written(store), []);
    },
  );

  it(
    'closes connections past its cap, and a request whose headers never end',
    { timeout: 30_000 },
    async () => {
      const { url } = await target({ maxConnections: 3, headersTimeoutMs: 500, requestTimeoutMs: 1_000 });
      const { hostname, port } = new URL(url);
      const open = (): Promise<{ socket: net.Socket; closed: Promise<number> }> =>
        new Promise((resolve) => {
          const started = Date.now();
          const socket = net.connect(Number(port), hostname, () =>
            resolve({
              socket,
              closed: new Promise((done) => socket.once('close', () => done(Date.now() - started))),
            }),
          );
          socket.on('error', () => undefined);
          socket.resume(); // read what comes (a 408), so the end of the stream, and the close, are seen
        });
      const held = [await open(), await open(), await open()];
      for (const { socket } of held) socket.write('POST /publications HTTP/1.1\r\nhost: x\r\n'); // never finished
      const extra = await open();
      assert.ok((await extra.closed) < 1_000, 'a connection past the cap was served');
      for (const { closed } of held)
        assert.ok((await closed) < 5_000, 'unfinished headers held a connection');
    },
  );
});

describe('publish target: the lookup by key', () => {
  it('answers GET /publications/<key> with the revision the key wrote, 404 for a key it never took, 401 unsigned', async () => {
    const secret = newSecret();
    const { url } = await target({ secret });
    const doc = publication();
    assert.equal((await signedPost(url, secret, doc, 'run-1:publish')).status, 201);
    const ask = (key: string, headers: Record<string, string>): Promise<RawAnswer> =>
      send('GET', `${url}/${encodeURIComponent(key)}`, '', headers);
    const signedAsk = (key: string) => ask(key, { 'idempotency-key': key, ...signer(secret)(key, '') });
    const found = await signedAsk('run-1:publish');
    assert.equal(found.status, 200, found.body);
    assert.deepEqual(JSON.parse(found.body), {
      documentId: doc.documentId,
      revision: 1,
      textRef: doc.textRef,
      idempotencyKey: 'run-1:publish',
    });
    assert.equal((await signedAsk('run-2:publish')).status, 404);
    assert.equal((await ask('run-1:publish', {})).status, 401);
    // Signed for another key: no asking about a key the signature does not cover.
    assert.equal((await ask('run-1:publish', signer(secret)('run-9:publish', ''))).status, 401);
  });

  it('settles a lost answer through the lookup, as the webhook publisher asks it', async () => {
    const { url, store } = await target();
    const ledger = scratchLedger(defer);
    const doc = publication();
    // The first POST lands, but its answer never comes back (the worker died, say): the claim stays open.
    await ledger.claim(deliveryOf(doc, 'run-1:publish', 2_000), 'dead-worker');
    await store.publish(doc, 'run-1:publish');
    const publisher = webhookPublisher(defer, url, {
      lookupUrl: `${url}/{key}`,
      timeoutMs: 2_000,
      ledger,
      policy: 'hold',
    });
    const receipt = await publisher.publish(doc, 'run-1:publish', new AbortController().signal);
    assert.deepEqual([receipt.revision, receipt.duplicate], [1, true]);
    assert.deepEqual(await ledger.openClaims(), []);
    assert.equal((await store.revisionsOf(doc.documentId)).length, 1);
  });
});
