/**
 * The publish targets: the SQLite publication store (a key never writes twice, a new key is a new revision) and
 * the webhook publisher against a real receiver and against receivers that fail in each way HTTP allows.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { ApplicationFailure } from '@temporalio/common';
import { PublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import type { Publication } from '../src/publisher/types';
import { WebhookPublisher } from '../src/publisher/webhook-publisher';
import { FailureType } from '../src/shared';
import { cleanupAfterAll, closeServer, listenOnLoopback, scratchDir } from './helpers';

const defer = cleanupAfterAll();

/** A publication store in a fresh temp folder, closed and removed after the file's tests. */
function freshStore(): PublicationStore {
  const dir = scratchDir(defer, 'publisher-test-');
  const store = new PublicationStore(path.join(dir, 'publications.db'));
  defer(() => store.close());
  return store;
}

function publication(documentId = `doc-${randomUUID()}`, summary = 'A summary.'): Publication {
  return {
    documentId,
    title: 'A title',
    textRef: `sha256:${'a'.repeat(64)}`,
    summary,
    tags: ['checkpoints'],
    model: { provider: 'offline', model: 'extractive-wink-nlp' },
  };
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
  it('never writes the same key twice: the second publish is a duplicate with the first revision', () => {
    const store = freshStore();
    const doc = publication();

    const first = store.publish(doc, 'run-1:publish');
    const second = store.publish({ ...doc, summary: 'A different summary.' }, 'run-1:publish');

    assert.deepEqual(first, { documentId: doc.documentId, revision: 1, duplicate: false });
    assert.deepEqual(second, { documentId: doc.documentId, revision: 1, duplicate: true });
    assert.deepEqual(store.revisionsOf(doc.documentId), [{ revision: 1, idempotencyKey: 'run-1:publish' }]);
    assert.equal(store.countPublications(), 1);
  });

  it('makes a new key for a known document (a workflow reset) its next revision, still one publication', () => {
    const store = freshStore();
    const doc = publication();

    store.publish(doc, 'run-1:publish');
    const afterReset = store.publish({ ...doc, summary: 'Redone.' }, 'run-2:publish');

    assert.deepEqual(afterReset, { documentId: doc.documentId, revision: 2, duplicate: false });
    assert.deepEqual(store.revisionsOf(doc.documentId), [
      { revision: 1, idempotencyKey: 'run-1:publish' },
      { revision: 2, idempotencyKey: 'run-2:publish' },
    ]);
    assert.equal(store.countPublications(), 1);
  });

  it('records every delivery attempt, duplicates included', () => {
    const store = freshStore();
    const doc = publication();

    store.publish(doc, 'run-1:publish');
    store.publish(doc, 'run-1:publish');

    assert.deepEqual(
      store.deliveries().map(({ idempotencyKey, documentId, outcome }) => ({
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
    const publisher = new WebhookPublisher(url, 5_000);
    const doc = publication();

    const first = await publisher.publish(doc, 'run-1:publish', NO_ABORT);
    const retry = await publisher.publish(doc, 'run-1:publish', NO_ABORT);

    assert.deepEqual(first, { documentId: doc.documentId, revision: 1, duplicate: false });
    assert.deepEqual(retry, { documentId: doc.documentId, revision: 1, duplicate: true });
    assert.deepEqual(
      store.deliveries().map((d) => [d.idempotencyKey, d.outcome]),
      [
        ['run-1:publish', 'created'],
        ['run-1:publish', 'duplicate'],
      ],
    );
  });

  it('turns 503 with Retry-After: 7 into a retryable failure with a 7 s next retry delay', async () => {
    const url = await scriptedServer((_req, res) => {
      res.writeHead(503, { 'retry-after': '7' }).end('down for maintenance');
    });
    const publisher = new WebhookPublisher(url, 5_000);

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
    const publisher = new WebhookPublisher(url, 5_000);

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
    const publisher = new WebhookPublisher(url, 300);

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
    assert.equal(store.deliveries().length, 0);
    assert.equal(store.countPublications(), 0);
  });
});
