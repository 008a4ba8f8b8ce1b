/**
 * The activities outside a worker, in MockActivityEnvironment: which key each step builds, that the key reaches
 * the model server, and that a received answer is never paid for twice.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import { DefaultLogger } from '@temporalio/worker';
import { pipelineActivities } from '../src/cli/compose';
import { HEARTBEAT_EVERY_MS, withHeartbeats } from '../src/steps/heartbeat';
import { idempotencyKey } from '../src/steps/idempotency';
import { FailureType } from '../src/contract';
import { answering, modelServerFor, openAIModel, SAMPLE_TEXT, tempParts } from './helpers';
import { cleanupAfterAll } from './scratch';
import type { LocalParts, ModelServer } from './helpers';

const defer = cleanupAfterAll();

const normalAnswer = answering('A short summary.', '{"tags": ["checkpoints"]}');

/** Local parts whose model is a loopback model server giving normal answers (no API key). */
async function partsWithModelServer(): Promise<{ server: ModelServer; local: LocalParts }> {
  const server = await modelServerFor(defer, normalAnswer);
  const local = await tempParts(defer, { model: openAIModel(server, { apiKey: undefined }) });
  return { server, local };
}

/** A summarize input for the sample text, stored in `local`'s blob store. */
async function summarizeInput(local: LocalParts) {
  return {
    documentId: 'doc-1',
    textRef: await local.blobs.put(Buffer.from(SAMPLE_TEXT)),
    maxSentences: 2,
  };
}

interface Attempt {
  activityId: string;
  runId: string;
  attempt?: number;
}

/** Runs `fn` as one attempt of one step of one workflow run, in a fresh mock activity context. */
function runAttempt<A extends unknown[], R>(
  { activityId, runId, attempt = 1 }: Attempt,
  fn: (...args: A) => Promise<R>,
  ...args: A
): Promise<R> {
  const env = new MockActivityEnvironment(
    { activityId, workflowExecution: { workflowId: 'document-test', runId }, attempt },
    { logger: new DefaultLogger('ERROR') },
  );
  return env.run<A, R, typeof fn>(fn, ...args);
}

/** The key the running step builds, as the activities see it. */
function keyOf(attempt: Attempt): Promise<string> {
  return runAttempt(attempt, () => Promise.resolve(idempotencyKey()));
}

describe('idempotencyKey', () => {
  it('is <workflow run ID>:<activity ID>', async () => {
    const runId = randomUUID();
    const key = await keyOf({ activityId: 'summarize', runId });
    assert.equal(key, `${runId}:summarize`);
  });

  it('stays the same across attempts of one step', async () => {
    const runId = randomUUID();
    const first = await keyOf({ activityId: 'publish', runId, attempt: 1 });
    const third = await keyOf({ activityId: 'publish', runId, attempt: 3 });
    assert.equal(third, first);
  });

  it('differs between runs of the same workflow (as after a reset) and between steps', async () => {
    const [runA, runB] = [randomUUID(), randomUUID()];
    const a = await keyOf({ activityId: 'publish', runId: runA });
    const b = await keyOf({ activityId: 'publish', runId: runB });
    const tag = await keyOf({ activityId: 'tag', runId: runA });
    assert.notEqual(a, b);
    assert.notEqual(a, tag);
  });
});

describe('model steps', () => {
  it('summarize and tag send their key as the Idempotency-Key header', async () => {
    const { server, local } = await partsWithModelServer();
    const { summarize, tag } = pipelineActivities(local.deps);
    const textRef = await local.blobs.put(Buffer.from(SAMPLE_TEXT));
    const runId = randomUUID();

    const summary = await runAttempt({ activityId: 'summarize', runId }, summarize, {
      documentId: 'doc-1',
      textRef,
      maxSentences: 2,
    });
    const tags = await runAttempt({ activityId: 'tag', runId }, tag, {
      documentId: 'doc-1',
      textRef,
      maxTags: 3,
    });

    assert.deepEqual(
      server.requests.map((r) => r.idempotencyKey),
      [`${runId}:summarize`, `${runId}:tag`],
    );
    assert.equal(summary.idempotencyKey, `${runId}:summarize`);
    assert.equal(summary.summary, 'A short summary.');
    assert.deepEqual(tags.tags, ['checkpoints']);
  });

  it('a later attempt with the same key reuses the memoised answer instead of calling the model', async () => {
    const { server, local } = await partsWithModelServer();
    const { summarize } = pipelineActivities(local.deps);
    const input = await summarizeInput(local);
    const runId = randomUUID();

    const first = await runAttempt({ activityId: 'summarize', runId, attempt: 1 }, summarize, input);
    const retry = await runAttempt({ activityId: 'summarize', runId, attempt: 2 }, summarize, input);

    assert.equal(server.requests.length, 1);
    assert.equal(first.memoised, false);
    assert.equal(retry.memoised, true);
    assert.equal(retry.summary, first.summary);
    assert.deepEqual(retry.usage, first.usage);
    assert.equal(await local.memo.count(), 1);
  });

  it('a new run of the workflow (a resubmission, a reset) reuses the paid answer; its key names the new run', async () => {
    const { server, local } = await partsWithModelServer();
    const { summarize } = pipelineActivities(local.deps);
    const input = await summarizeInput(local);
    const secondRun = randomUUID();

    await runAttempt({ activityId: 'summarize', runId: randomUUID() }, summarize, input);
    const again = await runAttempt({ activityId: 'summarize', runId: secondRun }, summarize, input);

    assert.equal(server.requests.length, 1);
    assert.equal(again.memoised, true);
    assert.equal(again.idempotencyKey, `${secondRun}:summarize`);
    assert.equal(await local.memo.count(), 1);
  });

  it('a different request of the same step (other options) is a memo miss and calls the model', async () => {
    const { server, local } = await partsWithModelServer();
    const { summarize } = pipelineActivities(local.deps);
    const input = await summarizeInput(local);
    const runId = randomUUID();

    await runAttempt({ activityId: 'summarize', runId }, summarize, input);
    const other = await runAttempt({ activityId: 'summarize', runId }, summarize, {
      ...input,
      maxSentences: 4,
    });

    assert.equal(server.requests.length, 2);
    assert.equal(other.memoised, false);
  });

  it('a text missing from the blob store fails without retry as InvalidDocument', async () => {
    const { server, local } = await partsWithModelServer();
    const { summarize } = pipelineActivities(local.deps);
    const missing = `sha256:${'0'.repeat(64)}`;

    await assert.rejects(
      runAttempt({ activityId: 'summarize', runId: randomUUID() }, summarize, {
        documentId: 'doc-1',
        textRef: missing,
        maxSentences: 2,
      }),
      (err) => {
        assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
        assert.equal(err.type, FailureType.InvalidDocument);
        assert.equal(err.nonRetryable, true);
        assert.ok(err.message.includes(missing), err.message);
        assert.match(err.message, /DATABASE_URL/);
        return true;
      },
    );
    assert.equal(server.requests.length, 0);
  });

  it('a stored text that is not usable (NUL bytes) fails without retry as InvalidDocument, saying why', async () => {
    const local = await tempParts(defer);
    const { tag } = pipelineActivities(local.deps);
    const textRef = await local.blobs.put(Buffer.from([0x68, 0x69, 0x00, 0x21]));

    await assert.rejects(
      runAttempt({ activityId: 'tag', runId: randomUUID() }, tag, {
        documentId: 'doc-1',
        textRef,
        maxTags: 3,
      }),
      (err) => {
        assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
        assert.equal(err.type, FailureType.InvalidDocument);
        assert.equal(err.nonRetryable, true);
        assert.match(err.message, /NUL byte/);
        return true;
      },
    );
  });

  it('a document with no prose (only a code block) fails summarize without retry, saying so', async () => {
    const local = await tempParts(defer);
    const { summarize } = pipelineActivities(local.deps);
    const textRef = await local.blobs.put(Buffer.from('```rust\nfn main() {}\n```\n', 'utf8'));

    await assert.rejects(
      runAttempt({ activityId: 'summarize', runId: randomUUID() }, summarize, {
        documentId: 'doc-1',
        textRef,
        maxSentences: 3,
      }),
      (err) => {
        assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
        assert.equal(err.type, FailureType.InvalidDocument);
        assert.equal(err.nonRetryable, true);
        assert.match(err.message, /no prose to summarize/);
        return true;
      },
    );
  });
});

describe('heartbeats', () => {
  /** Runs `fn` as one attempt of a step; returns its result and how many heartbeats it sent. */
  async function counted<R>(fn: () => Promise<R>): Promise<{ result: R; heartbeats: number }> {
    const env = new MockActivityEnvironment(
      { activityId: 'summarize', workflowExecution: { workflowId: 'document-test', runId: randomUUID() } },
      { logger: new DefaultLogger('ERROR') },
    );
    let heartbeats = 0;
    env.on('heartbeat', () => (heartbeats += 1));
    const result = await env.run<[], R, typeof fn>(fn);
    return { result, heartbeats };
  }

  it('a step that ends within the interval sends none (each would be a request and a write of the server)', async () => {
    const { local } = await partsWithModelServer();
    const { summarize } = pipelineActivities(local.deps);
    const input = await summarizeInput(local);
    const { result, heartbeats } = await counted(() => summarize(input));
    assert.equal(result.summary, 'A short summary.');
    assert.equal(heartbeats, 0);
  });

  it(
    'a longer step heartbeats once an interval has passed, and stops when it ends',
    { timeout: 30_000 },
    async () => {
      const { heartbeats } = await counted(() => withHeartbeats(() => sleep(HEARTBEAT_EVERY_MS * 1.5)));
      assert.equal(heartbeats, 1);
      const after = await counted(async () => {
        await withHeartbeats(() => Promise.resolve());
        await sleep(HEARTBEAT_EVERY_MS * 1.5);
      });
      assert.equal(after.heartbeats, 0);
    },
  );
});
