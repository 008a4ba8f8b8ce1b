/**
 * The publish targets: the SQLite publication store (a key never writes twice, a new key is a new revision, a new
 * key from an older run is stale and never written) and the webhook publisher against a real receiver and against
 * receivers that fail in each way HTTP allows.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import Database from 'better-sqlite3';
import { ApplicationFailure } from '@temporalio/common';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import type { PublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import { deliveryOf } from '../src/publisher/webhook-publisher';
import type { Publication } from '../src/publisher/types';
import { FailureType } from '../src/contract';
import {
  answerLookup,
  lookupKeyOf,
  closeServer,
  forwardPost,
  listenOnLoopback,
  openClaimOf,
  scratchLedger,
  webhookPublisher,
} from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();

/** A publication store in a fresh temp folder, closed and removed after the file's tests. */
function freshStore(): PublicationStore {
  const dir = scratchDir(defer, 'publisher-test-');
  const store = new SqlitePublicationStore(path.join(dir, 'publications.db'));
  defer(() => store.close());
  return store;
}

function publication(
  documentId = `doc-${randomUUID()}`,
  summary = 'A summary.',
  scheduledAt?: number,
): Publication {
  return {
    documentId,
    title: 'A title',
    textRef: `sha256:${'a'.repeat(64)}`,
    summary,
    tags: ['checkpoints'],
    model: { provider: 'offline', model: 'extractive-wink-nlp' },
    ...(scheduledAt === undefined ? {} : { scheduledAt }),
  };
}

/** The outcome of each delivery that reached `store`, as `[key, outcome]`. */
async function outcomes(store: PublicationStore): Promise<[string, string][]> {
  return (await store.deliveries()).map((d) => [d.idempotencyKey, d.outcome]);
}

const NO_ABORT = new AbortController().signal;

/** An HTTP server on loopback that answers every request with `handle`, closed after the file's tests. */
async function scriptedServer(handle: http.RequestListener): Promise<string> {
  const server = http.createServer(handle);
  const origin = await listenOnLoopback(server);
  defer(() => closeServer(server));
  return `${origin}/publications`;
}

/** A receiver backed by a fresh store, closed after the file's tests. */
async function receiver(): Promise<{ url: string; store: PublicationStore }> {
  const store = freshStore();
  const started = await startReceiver(store);
  defer(() => started.close());
  return { url: started.url, store };
}

describe('PublicationStore', () => {
  it('never writes the same key twice: the second publish is a duplicate with the first revision', async () => {
    const store = freshStore();
    const doc = publication();

    const first = await store.publish(doc, 'run-1:publish');
    const second = await store.publish({ ...doc, summary: 'A different summary.' }, 'run-1:publish');

    assert.deepEqual(first, { documentId: doc.documentId, revision: 1, duplicate: false });
    assert.deepEqual(second, { documentId: doc.documentId, revision: 1, duplicate: true });
    assert.deepEqual(await store.revisionsOf(doc.documentId), [
      { revision: 1, idempotencyKey: 'run-1:publish' },
    ]);
    assert.equal(await store.countPublications(), 1);
  });

  it('makes a new key for a known document (a workflow reset) its next revision, still one publication', async () => {
    const store = freshStore();
    const doc = publication();

    await store.publish(doc, 'run-1:publish');
    const afterReset = await store.publish({ ...doc, summary: 'Redone.' }, 'run-2:publish');

    assert.deepEqual(afterReset, {
      documentId: doc.documentId,
      revision: 2,
      duplicate: false,
      changed: true,
    });
    assert.deepEqual(await store.revisionsOf(doc.documentId), [
      { revision: 1, idempotencyKey: 'run-1:publish' },
      { revision: 2, idempotencyKey: 'run-2:publish' },
    ]);
    assert.equal(await store.countPublications(), 1);
  });

  it('answers a new key from an older run as stale: recorded, not written, the newer revision stays', async () => {
    const store = freshStore();
    const documentId = `doc-${randomUUID()}`;

    // Run A publishes r1; a reset starts run B (a later scheduledAt), which publishes r2.
    await store.publish(publication(documentId, 'From run A.', 1000), 'A:publish');
    const b = await store.publish(publication(documentId, 'From run B.', 3000), 'B:publish');
    // A zombie of a run between them (replaced before its publish ever reached the store) delivers late, under a
    // key the store has never seen and with its own, older scheduledAt.
    const zombie = await store.publish(publication(documentId, 'Stale.', 2000), 'Z:publish');
    const zombieRetry = await store.publish(publication(documentId, 'Stale.', 2000), 'Z:publish');
    const bRetry = await store.publish(publication(documentId, 'From run B.', 3000), 'B:publish');

    assert.deepEqual(b, { documentId, revision: 2, duplicate: false, changed: true });
    assert.deepEqual(zombie, { documentId, revision: 2, duplicate: false, superseded: true });
    assert.deepEqual(zombieRetry, zombie);
    assert.deepEqual(bRetry, { documentId, revision: 2, duplicate: true });
    assert.deepEqual(await store.revisionsOf(documentId), [
      { revision: 1, idempotencyKey: 'A:publish' },
      { revision: 2, idempotencyKey: 'B:publish' },
    ]);
    assert.deepEqual(await store.currentPublication(documentId), {
      documentId,
      revision: 2,
      title: 'A title',
      scheduledAt: 3000,
      fields: { summary: 'From run B.', tags: ['checkpoints'] },
    });
    assert.deepEqual(await outcomes(store), [
      ['A:publish', 'created'],
      ['B:publish', 'created'],
      ['Z:publish', 'stale'],
      ['Z:publish', 'stale'],
      ['B:publish', 'duplicate'],
    ]);
  });

  it('answers a key it has seen as a duplicate even when a newer run has published since', async () => {
    const store = freshStore();
    const documentId = `doc-${randomUUID()}`;

    await store.publish(publication(documentId, 'From run A.', 1000), 'A:publish');
    await store.publish(publication(documentId, 'From run B.', 2000), 'B:publish');
    const aRetry = await store.publish(publication(documentId, 'From run A.', 1000), 'A:publish');

    assert.deepEqual(aRetry, { documentId, revision: 1, duplicate: true });
    assert.equal((await store.currentPublication(documentId))?.fields.summary, 'From run B.');
  });

  it('orders only publications that carry scheduledAt: without it a new key is the next revision, as before', async () => {
    const store = freshStore();
    const documentId = `doc-${randomUUID()}`;

    const legacy = await store.publish(publication(documentId, 'Unordered.'), 'L:publish');
    const ordered = await store.publish(publication(documentId, 'Ordered.', 2000), 'B:publish');
    const legacyAgain = await store.publish(publication(documentId, 'Unordered again.'), 'M:publish');
    // The unordered publication did not erase the order: an older run is still refused.
    const older = await store.publish(publication(documentId, 'Older.', 1000), 'A:publish');
    // A later run (or the same scheduledAt under another key) is the next revision.
    const newer = await store.publish(publication(documentId, 'Newer.', 2000), 'C:publish');

    assert.deepEqual(
      [legacy, ordered, legacyAgain, older, newer].map((r) => [r.revision, r.superseded ?? false]),
      [
        [1, false],
        [2, false],
        [3, false],
        [3, true],
        [4, false],
      ],
    );
    assert.equal((await store.currentPublication(documentId))?.fields.summary, 'Newer.');
    assert.equal((await store.currentPublication(documentId))?.scheduledAt, 2000);
  });

  it('opens a database made before publications were ordered and orders from then on', async () => {
    const file = path.join(scratchDir(defer, 'publisher-test-'), 'publications.db');
    const old = new Database(file);
    old.exec(`
      CREATE TABLE publications (document_id TEXT PRIMARY KEY, revision INTEGER NOT NULL, title TEXT NOT NULL,
        summary TEXT NOT NULL, tags TEXT NOT NULL, updated_at TEXT NOT NULL);
      INSERT INTO publications VALUES ('doc-old', 1, 'A title', 'Old.', '[]', '2025-01-01T00:00:00.000Z');`);
    old.close();
    const store = new SqlitePublicationStore(file);
    defer(() => store.close());

    const next = await store.publish(publication('doc-old', 'From run B.', 2000), 'B:publish');
    const older = await store.publish(publication('doc-old', 'Older.', 1000), 'A:publish');

    assert.deepEqual(next, { documentId: 'doc-old', revision: 2, duplicate: false, changed: true });
    assert.deepEqual(older, { documentId: 'doc-old', revision: 2, duplicate: false, superseded: true });
  });

  it('records every delivery attempt, duplicates included', async () => {
    const store = freshStore();
    const doc = publication();

    await store.publish(doc, 'run-1:publish');
    await store.publish(doc, 'run-1:publish');

    assert.deepEqual(
      (await store.deliveries()).map(({ idempotencyKey, documentId, outcome }) => ({
        idempotencyKey,
        documentId,
        outcome,
      })),
      [
        { idempotencyKey: 'run-1:publish', documentId: doc.documentId, outcome: 'created' },
        { idempotencyKey: 'run-1:publish', documentId: doc.documentId, outcome: 'duplicate' },
      ],
    );
  });
});

describe('WebhookPublisher', () => {
  it('sends the Idempotency-Key; a retry with the same key is answered as a duplicate', async () => {
    const { url, store } = await receiver();
    const publisher = webhookPublisher(defer, url, { timeoutMs: 5_000 });
    const doc = publication();

    const first = await publisher.publish(doc, 'run-1:publish', NO_ABORT);
    const retry = await publisher.publish(doc, 'run-1:publish', NO_ABORT);

    // The receiver echoed the key, so the receipt says it dedupes; the retry is answered from the ledger.
    assert.deepEqual(first, {
      documentId: doc.documentId,
      revision: 1,
      duplicate: false,
      receiverHonoursKey: true,
    });
    assert.deepEqual(retry, { documentId: doc.documentId, revision: 1, duplicate: true });
    assert.deepEqual(await outcomes(store), [['run-1:publish', 'created']], 'the retry POSTed again');
  });

  it('passes a stale answer through as a superseded receipt with the current revision', async () => {
    const { url, store } = await receiver();
    const publisher = webhookPublisher(defer, url, { timeoutMs: 5_000 });
    const documentId = `doc-${randomUUID()}`;

    await publisher.publish(publication(documentId, 'From run B.', 2000), 'B:publish', NO_ABORT);
    const late = await publisher.publish(publication(documentId, 'Stale.', 1000), 'A:publish', NO_ABORT);

    assert.deepEqual(late, {
      documentId,
      revision: 1,
      duplicate: false,
      superseded: true,
      receiverHonoursKey: true,
    });
    assert.equal((await store.currentPublication(documentId))?.fields.summary, 'From run B.');
  });

  it('turns 503 with Retry-After: 7 into a retryable failure with a 7 s next retry delay', async () => {
    const url = await scriptedServer((_req, res) => {
      res.writeHead(503, { 'retry-after': '7' }).end('down for maintenance');
    });
    const publisher = webhookPublisher(defer, url, { timeoutMs: 5_000 });

    await assert.rejects(publisher.publish(publication(), 'run-1:publish', NO_ABORT), (err) => {
      assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
      assert.equal(err.type, FailureType.TransientPublishError);
      assert.equal(err.nonRetryable, false);
      assert.equal(err.nextRetryDelay, 7_000);
      assert.match(err.message, /HTTP 503/);
      return true;
    });
  });

  it('fails a 400 without retry as PublishRejected, quoting the body', async () => {
    const url = await scriptedServer((_req, res) => {
      res.writeHead(400).end('{"error":"tags must not be empty"}');
    });
    const publisher = webhookPublisher(defer, url, { timeoutMs: 5_000 });

    await assert.rejects(publisher.publish(publication(), 'run-1:publish', NO_ABORT), (err) => {
      assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
      assert.equal(err.type, FailureType.PublishRejected);
      assert.equal(err.nonRetryable, true);
      assert.match(err.message, /HTTP 400/);
      assert.ok(err.message.includes('tags must not be empty'), err.message);
      return true;
    });
  });

  it('gives up on a receiver that never answers after the timeout, retryably', async () => {
    let received = 0;
    const url = await scriptedServer(() => {
      received += 1; // and never answer
    });
    const publisher = webhookPublisher(defer, url, { timeoutMs: 300 });

    const started = Date.now();
    await assert.rejects(publisher.publish(publication(), 'run-1:publish', NO_ABORT), (err) => {
      assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
      assert.equal(err.type, FailureType.TransientPublishError);
      assert.equal(err.nonRetryable, false);
      assert.match(err.message, /no answer within 300 ms/);
      return true;
    });
    const waited = Date.now() - started;
    assert.ok(waited >= 250 && waited < 5_000, `gave up after ${waited} ms`);
    assert.equal(received, 1);
  });
});

/**
 * A receiver for the ledger tests: it records every POST it takes as an effect, and loses its reply (drops the
 * connection) for the first `lose` requests, after taking the effect or before. It dedupes by key, and echoes the
 * key, only when told to: many real receivers do neither.
 */
async function forgetfulReceiver({
  lose,
  losesBeforeEffect = false,
  honoursKeys = false,
  status = () => 201,
}: {
  lose: number;
  losesBeforeEffect?: boolean;
  honoursKeys?: boolean;
  status?: (n: number) => number;
}): Promise<{ url: string; effects: string[]; requests: () => number }> {
  const effects: string[] = [];
  let requests = 0;
  const url = await scriptedServer((req, res) => {
    req.resume();
    req.on('end', () => {
      requests += 1;
      const key = String(req.headers['idempotency-key']);
      const lost = requests <= lose;
      if (lost && losesBeforeEffect) return void res.socket?.destroy();
      const code = status(requests);
      const duplicate = honoursKeys && effects.includes(key);
      if (code < 300 && !duplicate) effects.push(key);
      if (lost) return void res.socket?.destroy();
      res
        .writeHead(code, {
          'content-type': 'application/json',
          ...(honoursKeys ? { 'idempotency-key': key } : {}),
        })
        .end(JSON.stringify({ revision: 1, duplicate }));
    });
  });
  return { url, effects, requests: () => requests };
}

/** For assert.rejects: a retryable ApplicationFailure of `type`, checked further by `check`. */
function retryable(type: string, check: (err: ApplicationFailure) => void = () => undefined) {
  return (err: unknown): boolean => {
    assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
    assert.equal(err.type, type, err.message);
    assert.equal(err.nonRetryable, false);
    check(err);
    return true;
  };
}

describe('WebhookPublisher: the delivery ledger before the effect', () => {
  it('after a lost reply from a receiver that does not dedupe, the retry holds instead of POSTing until an operator says it arrived', async () => {
    const receiver = await forgetfulReceiver({ lose: 1 });
    const ledger = scratchLedger(defer);
    const publisher = webhookPublisher(defer, receiver.url, { ledger });
    const doc = publication();
    const key = 'run-1:publish';

    await assert.rejects(publisher.publish(doc, key, NO_ABORT), retryable(FailureType.TransientPublishError));
    await assert.rejects(
      publisher.publish(doc, key, NO_ABORT),
      retryable(FailureType.DeliveryHeld, (err) => {
        assert.equal(err.nextRetryDelay, 30_000);
        assert.ok(
          err.message.includes(`npm run deliveries -- resolve ${key} delivered --revision N`),
          err.message,
        );
      }),
    );
    assert.deepEqual(receiver.effects, [key]);
    assert.deepEqual(
      (await ledger.openClaims()).map((e) => [e.idempotencyKey, e.documentId, e.attempts]),
      [[key, doc.documentId, 1]],
    );

    assert.ok(
      await ledger.resolve(await openClaimOf(ledger, key), {
        delivered: { documentId: doc.documentId, revision: 1, duplicate: true },
      }),
    );
    const receipt = await publisher.publish(doc, key, NO_ABORT);
    assert.deepEqual(receipt, { documentId: doc.documentId, revision: 1, duplicate: true });
    assert.deepEqual(receiver.effects, [key], 'a held delivery was sent again');
    assert.equal(receiver.requests(), 1);
    assert.deepEqual(await ledger.openClaims(), []);
  });

  it('an operator\'s "unsent" verdict lets the next retry send it, once', async () => {
    const receiver = await forgetfulReceiver({ lose: 1, losesBeforeEffect: true });
    const ledger = scratchLedger(defer);
    const publisher = webhookPublisher(defer, receiver.url, { ledger });
    const doc = publication();

    await assert.rejects(publisher.publish(doc, 'run-1:publish', NO_ABORT));
    await assert.rejects(
      publisher.publish(doc, 'run-1:publish', NO_ABORT),
      retryable(FailureType.DeliveryHeld),
    );
    const seen = await openClaimOf(ledger, 'run-1:publish');
    assert.ok(await ledger.resolve(seen, 'unsent'));
    assert.equal(await ledger.resolve(seen, 'unsent'), false, 'a settled key resolved twice');
    const receipt = await publisher.publish(doc, 'run-1:publish', NO_ABORT);
    assert.equal(receipt.duplicate, false);
    assert.deepEqual(receiver.effects, ['run-1:publish']);
    assert.equal(receiver.requests(), 2);
  });

  it('a receiver that has echoed a key dedupes, so an open claim is sent again and answered as a duplicate', async () => {
    // The reply to the second request (the first delivery of "run-2:publish") is lost after the effect.
    let n = 0;
    const receiver = await forgetfulReceiver({ lose: 0, honoursKeys: true, status: () => 201 });
    const ledger = scratchLedger(defer);
    const dropSecond = await scriptedServer((req, res) => {
      n += 1;
      void forwardPost(receiver.url, req, res, { dropReply: n === 2 });
    });
    const publisher = webhookPublisher(defer, dropSecond, { ledger });

    const first = await publisher.publish(publication(), 'run-1:publish', NO_ABORT);
    assert.equal(first.receiverHonoursKey, true);
    const doc = publication();
    await assert.rejects(publisher.publish(doc, 'run-2:publish', NO_ABORT));
    const resent = await publisher.publish(doc, 'run-2:publish', NO_ABORT);

    assert.equal(resent.duplicate, true);
    assert.deepEqual(receiver.effects, ['run-1:publish', 'run-2:publish']);
    assert.deepEqual(await ledger.openClaims(), []);
  });

  for (const { policy, honoursKeys, resends } of [
    { policy: 'resend', honoursKeys: false, resends: true },
    { policy: 'hold', honoursKeys: true, resends: false },
  ] as const) {
    it(`OPEN_DELIVERY_POLICY=${policy} ${resends ? 'resends an open claim without an echo' : 'holds an open claim even with an echo'}`, async () => {
      const receiver = await forgetfulReceiver({ lose: 1, honoursKeys });
      const publisher = webhookPublisher(defer, receiver.url, { policy });
      const doc = publication();

      await assert.rejects(publisher.publish(doc, 'run-1:publish', NO_ABORT));
      const retry = publisher.publish(doc, 'run-1:publish', NO_ABORT);
      if (resends) await retry;
      else await assert.rejects(retry, retryable(FailureType.DeliveryHeld));
      assert.equal(receiver.requests(), resends ? 2 : 1);
    });
  }

  it('a 409 ("key in use") proves nothing, so the claim stays open: a receiver that dedupes gets it again', async () => {
    const receiver = await forgetfulReceiver({ lose: 0, status: (n) => (n === 1 ? 409 : 201) });
    const ledger = scratchLedger(defer);
    const publisher = webhookPublisher(defer, receiver.url, { ledger, policy: 'resend' });
    const doc = publication();

    await assert.rejects(
      publisher.publish(doc, 'run-1:publish', NO_ABORT),
      retryable(FailureType.TransientPublishError, (err) => assert.match(err.message, /HTTP 409/)),
    );
    assert.deepEqual(
      (await ledger.openClaims()).map((e) => e.lastError),
      ['HTTP 409'],
      'a 409 settled the claim',
    );
    await publisher.publish(doc, 'run-1:publish', NO_ABORT);
    assert.deepEqual(receiver.effects, ['run-1:publish']);
    assert.equal(receiver.requests(), 2);
  });

  for (const status of [502, 504]) {
    it(`a gateway's ${status} after the origin applied the POST publishes once: the claim stays open and the retry holds`, async () => {
      // The origin applies every POST (it ignores keys); the gateway in front answers the first one with an error.
      const effects: string[] = [];
      const url = await scriptedServer((req, res) => {
        req.resume();
        req.on('end', () => {
          effects.push(String(req.headers['idempotency-key']));
          res.writeHead(effects.length === 1 ? status : 201, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ revision: 1 }));
        });
      });
      for (const policy of ['auto', 'hold'] as const) {
        effects.length = 0;
        const ledger = scratchLedger(defer);
        const publisher = webhookPublisher(defer, url, { ledger, policy });
        const key = `run-${policy}:publish`;
        await assert.rejects(
          publisher.publish(publication(), key, NO_ABORT),
          retryable(FailureType.TransientPublishError, (err) =>
            assert.match(err.message, new RegExp(`HTTP ${status}`)),
          ),
        );
        await assert.rejects(
          publisher.publish(publication(), key, NO_ABORT),
          retryable(FailureType.DeliveryHeld),
          `${policy}: the retry was not held`,
        );
        assert.deepEqual(effects, [key], `${policy}: posted again after a ${status}`);
      }
    });
  }

  for (const status of [301, 302, 307, 308]) {
    it(`never follows a ${status}: nothing is sent to the Location, and the step fails naming it`, async () => {
      let elsewhere = 0;
      const other = await scriptedServer((req, res) => {
        elsewhere += 1;
        req.resume();
        res.writeHead(201, { 'idempotency-key': String(req.headers['idempotency-key']) }).end('{}');
      });
      const url = await scriptedServer((req, res) => {
        req.resume();
        res.writeHead(status, { location: `${other}?token=secret` }).end();
      });
      const ledger = scratchLedger(defer);
      await assert.rejects(
        webhookPublisher(defer, url, { ledger }).publish(publication(), 'run-1:publish', NO_ABORT),
        (err) => {
          assert.ok(err instanceof ApplicationFailure, String(err));
          assert.equal(err.type, FailureType.PublishRejected);
          assert.equal(err.nonRetryable, true);
          assert.match(
            err.message,
            new RegExp(`HTTP ${status}, redirecting to ${other.replace(/[/.]/g, '\\$&')};`),
          );
          assert.doesNotMatch(err.message, /secret/);
          return true;
        },
      );
      assert.equal(elsewhere, 0, 'the signed POST (or a GET) went to the Location');
      // A receiver may apply a POST and then redirect (POST-redirect-GET): the claim stays open, never "unsent".
      assert.deepEqual(
        (await ledger.openClaims()).map((e) => [e.idempotencyKey, e.lastError]),
        [['run-1:publish', `HTTP ${status} redirect`]],
      );
    });
  }

  it("trusts an echo only from the receiver that gave it: another receiver's lost answer is held, not sent again", async () => {
    const ledger = scratchLedger(defer);
    const echoing = await forgetfulReceiver({ lose: 0, honoursKeys: true });
    await webhookPublisher(defer, echoing.url, { ledger }).publish(publication(), 'run-1:publish', NO_ABORT);
    // A second receiver on the same ledger: it ignores keys, and its first answer is lost.
    const other = await forgetfulReceiver({ lose: 1 });
    const publisher = webhookPublisher(defer, other.url, { ledger, timeoutMs: 2_000 });
    await assert.rejects(publisher.publish(publication(), 'run-2:publish', NO_ABORT));
    await assert.rejects(
      publisher.publish(publication(), 'run-2:publish', NO_ABORT),
      retryable(FailureType.DeliveryHeld),
    );
    assert.deepEqual(other.effects, ['run-2:publish']);
  });

  it('a refused connection is known not to have arrived: the claim is not left open', async () => {
    const server = http.createServer();
    const origin = await listenOnLoopback(server);
    await closeServer(server);
    const ledger = scratchLedger(defer);
    const publisher = webhookPublisher(defer, `${origin}/publications`, { ledger });

    await assert.rejects(
      publisher.publish(publication(), 'run-1:publish', NO_ABORT),
      retryable(FailureType.TransientPublishError),
    );
    assert.deepEqual(await ledger.openClaims(), []);
  });
});

describe('startReceiver', () => {
  it('rejects a publication without an Idempotency-Key with 400 and stores nothing', async () => {
    const { url, store } = await receiver();

    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(publication()),
    });

    assert.equal(response.status, 400);
    assert.match(await response.text(), /Idempotency-Key/);
    assert.equal((await store.deliveries()).length, 0);
    assert.equal(await store.countPublications(), 0);
  });

  it('answers a new key from an older run with 200 and a superseded receipt, and writes nothing', async () => {
    const { url, store } = await receiver();
    const documentId = `doc-${randomUUID()}`;
    const post = (body: Publication, key: string) =>
      fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify(body),
      });

    const a = await post(publication(documentId, 'From run A.', 1000), 'A:publish');
    const b = await post(publication(documentId, 'From run B.', 3000), 'B:publish');
    const zombie = await post(publication(documentId, 'Stale.', 2000), 'Z:publish');
    const bRetry = await post(publication(documentId, 'From run B.', 3000), 'B:publish');

    assert.deepEqual([a.status, b.status, zombie.status, bRetry.status], [201, 201, 200, 200]);
    assert.deepEqual(await zombie.json(), { documentId, revision: 2, duplicate: false, superseded: true });
    assert.deepEqual(await bRetry.json(), { documentId, revision: 2, duplicate: true });
    assert.deepEqual(
      (await store.revisionsOf(documentId)).map((r) => r.idempotencyKey),
      ['A:publish', 'B:publish'],
    );
    assert.equal((await store.currentPublication(documentId))?.fields.summary, 'From run B.');
    assert.deepEqual(await outcomes(store), [
      ['A:publish', 'created'],
      ['B:publish', 'created'],
      ['Z:publish', 'stale'],
      ['B:publish', 'duplicate'],
    ]);
  });
});

describe("WebhookPublisher: an earlier run's open delivery, and the receiver's lookup", () => {
  it("a resubmitted run finds the earlier run's open delivery of the same version: held, never posted blindly", async () => {
    const receiver = await forgetfulReceiver({ lose: 1 });
    const ledger = scratchLedger(defer);
    const publisher = webhookPublisher(defer, receiver.url, { ledger, timeoutMs: 2_000 });
    const doc = publication();
    await assert.rejects(publisher.publish(doc, 'run-1:publish', NO_ABORT));
    // The run failed (its budget ran out, say); the document is submitted again: a new run, a new key.
    await assert.rejects(
      publisher.publish(doc, 'run-2:publish', NO_ABORT),
      retryable(FailureType.DeliveryHeld, (err) => {
        assert.match(
          err.message,
          /an earlier run sent this version .*key run-1:publish, this run's is run-2:publish/,
        );
        assert.match(err.message, /npm run deliveries -- resolve run-1:publish delivered --revision N/);
      }),
    );
    assert.deepEqual(receiver.effects, ['run-1:publish']);
    // Another version of the document is another delivery: it goes out.
    await publisher.publish({ ...doc, textRef: `sha256:${'b'.repeat(64)}` }, 'run-3:publish', NO_ABORT);
    assert.deepEqual(receiver.effects, ['run-1:publish', 'run-3:publish']);
  });

  it("sent again to a receiver that dedupes, it goes under the earlier run's key: one effect, both runs settled", async () => {
    const receiver = await forgetfulReceiver({ lose: 1, honoursKeys: true });
    const ledger = scratchLedger(defer);
    const publisher = webhookPublisher(defer, receiver.url, { ledger, timeoutMs: 2_000, policy: 'resend' });
    const doc = publication();
    await assert.rejects(publisher.publish(doc, 'run-1:publish', NO_ABORT));
    const receipt = await publisher.publish(doc, 'run-2:publish', NO_ABORT);
    assert.equal(receipt.duplicate, true);
    assert.deepEqual(receiver.effects, ['run-1:publish']);
    assert.equal(receiver.requests(), 2);
    assert.deepEqual(await ledger.openClaims(), []);
    // A retry of run 2 answers from the ledger.
    assert.equal((await publisher.publish(doc, 'run-2:publish', NO_ABORT)).duplicate, true);
    assert.equal(receiver.requests(), 2);
  });

  /** A receiver that ignores keys, with a lookup by key; `lost` says how its first POST goes wrong. */
  /**
   * A receiver that does not dedupe, with a lookup in the documented shape (docs/recovery.md): 200 naming the key
   * and the version it delivered, 404 naming the key with `"found": false`. Its first POST loses the answer (the
   * effect happens) or the request (no effect).
   */
  async function receiverWithLookup(lost: 'answer' | 'request') {
    const effects: string[] = [];
    const versions = new Map<string, string>();
    let posts = 0;
    const url = await scriptedServer((req, res) => {
      if (req.method === 'GET') {
        req.resume();
        const key = lookupKeyOf(req);
        const textRef = versions.get(key);
        return answerLookup(res, key, textRef === undefined ? undefined : { revision: 1, textRef });
      }
      let body = '';
      req.on('data', (chunk: Buffer) => (body += chunk.toString('utf8')));
      req.on('end', () => {
        posts += 1;
        if (posts === 1 && lost === 'request') return void res.socket?.destroy();
        const sentKey = String(req.headers['idempotency-key']);
        effects.push(sentKey);
        versions.set(sentKey, String((JSON.parse(body) as { textRef: unknown }).textRef));
        if (posts === 1) return void res.socket?.destroy();
        res.writeHead(201).end(JSON.stringify({ revision: 1 }));
      });
    });
    return {
      url,
      lookupUrl: url.replace(/\/publications$/, '/publications/{key}'),
      effects,
      posts: () => posts,
    };
  }

  it("does not believe the lookup's 404 while the earlier attempt's POST may still be on its way: held, not sent", async () => {
    const receiver = await receiverWithLookup('answer');
    const ledger = scratchLedger(defer);
    const doc = publication();
    // A stalled attempt claimed the delivery a moment ago, and its POST has not arrived (yet).
    await ledger.claim(deliveryOf(doc, 'run-1:publish', 10_000), 'stalled-attempt');
    const publisher = webhookPublisher(defer, receiver.url, {
      lookupUrl: receiver.lookupUrl,
      timeoutMs: 10_000,
      ledger,
      policy: 'hold',
    });
    await assert.rejects(
      publisher.publish(doc, 'run-1:publish', NO_ABORT),
      retryable(FailureType.DeliveryHeld),
    );
    assert.equal(receiver.posts(), 0, 'sent while the stalled attempt may still send it');
  });

  for (const lost of ['answer', 'request'] as const) {
    it(`asks the receiver's lookup before holding: the ${lost} was lost, and the claim settles by itself`, async () => {
      const receiver = await receiverWithLookup(lost);
      const ledger = scratchLedger(defer);
      // A short request timeout: the POST may be under way (or still processed) for it and a 5 s grace.
      const timeoutMs = 500;
      const publisher = webhookPublisher(defer, receiver.url, {
        lookupUrl: receiver.lookupUrl,
        timeoutMs,
        ledger,
        policy: 'hold',
      });
      const doc = publication();
      await assert.rejects(publisher.publish(doc, 'run-1:publish', NO_ABORT));
      if (lost === 'request') {
        // The lookup's 404 is not believed while the lost POST may still reach the receiver or be processed.
        await assert.rejects(
          publisher.publish(doc, 'run-1:publish', NO_ABORT),
          retryable(FailureType.DeliveryHeld),
        );
        assert.equal(receiver.posts(), 1, 'sent again on a 404 while the first POST may still land');
        await sleep(deliveryOf(doc, 'run-1:publish', timeoutMs).inFlightMs + 200);
      }
      const receipt = await publisher.publish(doc, 'run-1:publish', NO_ABORT);
      assert.deepEqual(receiver.effects, ['run-1:publish']);
      assert.equal(
        receiver.posts(),
        lost === 'answer' ? 1 : 2,
        'posted again after the lookup said it had it',
      );
      assert.equal(receipt.duplicate, lost === 'answer');
      assert.deepEqual(await ledger.openClaims(), []);
    });
  }
});
