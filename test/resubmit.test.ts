/**
 * A failed run resubmitted: the answers it paid for are reused. The run fails at publish (the receiver refuses
 * it), the receiver is fixed, the document is submitted again: a new run of the same workflow ID, whose
 * summarize and tag come from the memo, so the model server sees no second call. On both backends.
 */
import type { PipelineResult } from '../src/cli/compose';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { FailureType } from '../src/contract';
import type { DocumentFile } from '../src/documents/files';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import { submitDocument } from '../src/runs/submit';
import {
  forwardPost,
  closeServer,
  installQuietRuntime,
  listenOnLoopback,
  modelServerFor,
  normalAnswer,
  openAIModel,
  pipelineWorker,
  SAMPLE_TEXT,
  stepFailure,
  tempParts,
  timeSkippingEnv,
  webhookPublisher,
} from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';
import { freshDatabase } from './postgres';

const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await timeSkippingEnv(defer);
});

/** A receiver that refuses every publication with 400 until `fixed`, then behaves like the real one. */
async function flakyReceiver(): Promise<{ url: string; fix(): void; store: SqlitePublicationStore }> {
  const store = new SqlitePublicationStore(`${scratchDir(defer)}/receiver.db`);
  defer(() => store.close());
  // Workflow time on the time-skipping server runs ahead of the wall clock the receiver bounds scheduledAt by.
  const real = await startReceiver(store, { scheduleSkewMs: Infinity });
  defer(() => real.close());
  let fixed = false;
  const server = http.createServer((req, res) => {
    if (!fixed) {
      req.resume();
      res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":"receiver misconfigured"}');
      return;
    }
    void forwardPost(real.url, req, res);
  });
  const origin = await listenOnLoopback(server);
  defer(() => closeServer(server));
  return { url: `${origin}/publications`, fix: () => (fixed = true), store };
}

for (const backend of ['sqlite', 'postgres'] as const) {
  describe(`a failed run resubmitted (${backend})`, () => {
    it('reuses the paid answers: the model server sees no second call for summarize and tag', async () => {
      const server = await modelServerFor(defer, normalAnswer);
      const receiver = await flakyReceiver();
      const local = await tempParts(defer, {
        model: openAIModel(server),
        publisher: webhookPublisher(defer, receiver.url),
        env: backend === 'postgres' ? { DATABASE_URL: await freshDatabase(defer) } : {},
      });
      const taskQueue = `resubmit-${randomUUID()}`;
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      const document: DocumentFile = {
        source: 'notes.md',
        documentId: `notes-${randomUUID()}`,
        title: 'Notes',
        bytes: Buffer.from(SAMPLE_TEXT, 'utf8'),
      };

      await worker.runUntil(async () => {
        const failed = await submitDocument(env.client, local.blobs, taskQueue, document);
        await assert.rejects(
          failed.handle.result(),
          stepFailure('publish', (failure) => assert.equal(failure.type, FailureType.PublishRejected)),
        );
        assert.equal(server.requests.length, 2, 'summarize and tag were each asked once');

        receiver.fix();
        const again = await submitDocument(env.client, local.blobs, taskQueue, document);
        assert.equal(again.attachedTo, 'new');
        const result = (await again.handle.result()) as PipelineResult;
        const { runId } = await again.handle.describe();

        assert.equal(server.requests.length, 2, 'the resubmission paid the model again');
        assert.equal(result.summary.memoised, true);
        assert.equal(result.tags.memoised, true);
        // The keys name the new run: a provider that dedupes would see a new request, and none was sent.
        assert.equal(result.summary.idempotencyKey, `${runId}:summarize`);
        assert.notEqual(runId, (await failed.handle.describe()).runId);
        assert.equal(result.publication?.revision, 1);
        assert.deepEqual(
          (await receiver.store.revisionsOf(document.documentId)).map((r) => r.idempotencyKey),
          [`${runId}:publish`],
        );
      });
    });
  });
}
