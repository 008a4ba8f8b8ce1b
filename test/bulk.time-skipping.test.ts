/**
 * Bulk mode on the time-skipping test server: the batch's model requests go to a local server that follows the
 * providers' batch APIs (demo/batch-server.ts), whose answers arrive minutes later, at the third look; the
 * workflow's timers wait for them in no wall time. The answers land in the memo, and each document's steps take
 * them from there without a call. Partial errors and refused answers go into a second provider batch; what an
 * expired batch left goes to the documents' own calls; a cancelled batch cancels its provider batch and keeps
 * what was paid.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { temporal } from '@temporalio/proto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import type { PipelineResult } from '../src/cli/compose';
import { batchProgressQuery } from '../src/workflow';
import { bulkSetup, documentFolder, resultWithin, serverCounts, startBulkBatch } from './bulk-helpers';
import { installQuietRuntime, pipelineWorker, timeSkippingEnv } from './helpers';
import { cleanupAfterAll } from './scratch';

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();

before(async () => {
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
});

/** Each document's run result, read from its own workflow. */
async function documentResults(workflowIds: string[]): Promise<PipelineResult[]> {
  return Promise.all(
    workflowIds.map((id) => env.client.workflow.getHandle(id).result() as Promise<PipelineResult>),
  );
}

/** The durations of the timers a history started, in seconds. */
function timerSeconds(history: temporal.api.history.v1.IHistory): number[] {
  return (history.events ?? [])
    .filter((e) => e.timerStartedEventAttributes != null)
    .map((e) => Number(e.timerStartedEventAttributes?.startToFireTimeout?.seconds ?? 0));
}

describe('bulk mode on the time-skipping server', () => {
  it('answers every model step from one provider batch, minutes later, at half the price, with no call of its own', async () => {
    const { server, local } = await bulkSetup(defer, 'openai', { completeAtLook: 3 });
    const folder = documentFolder(defer, 6);
    const taskQueue = `bulk-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const wallStart = Date.now();
    const budgetId = `bulk-budget-${randomUUID()}`;
    const { progress, history } = await worker.runUntil(async () => {
      const { handle } = await startBulkBatch(
        env.client,
        local.blobs,
        folder,
        taskQueue,
        {},
        { id: budgetId, usd: 5 },
      );
      const progress = await resultWithin(handle, 90_000);
      return { progress, history: await handle.fetchHistory() };
    });
    assert.ok(Date.now() - wallStart < 120_000, 'the minutes of waiting took real time');
    assert.equal(progress.tally.done, 6);
    assert.equal(progress.tally.failed, 0);
    // Every model answer came from the memo: none was paid by a document's step.
    assert.equal(progress.tally.memoised, 12);
    assert.equal(server.direct.length, 0, 'a document step called the model');
    const counts = serverCounts(server);
    assert.equal(counts.batches, 1);
    assert.equal(server.batches[0]?.lines.length, 12);
    assert.deepEqual(counts.answeredTwice, []);
    // The workflow's own timers waited, backing off: 1, 2 and 4 minutes until the third look found it ended.
    assert.deepEqual(timerSeconds(history), [60, 120, 240]);
    const bulk = progress.bulk;
    assert.equal(bulk?.phase, 'done');
    assert.equal(bulk?.totals.answered, 12);
    assert.equal(bulk?.batches[0]?.status, 'completed');
    assert.ok(bulk?.totals.costUsd != null && bulk.totals.listCostUsd != null);
    assert.ok(Math.abs(bulk.totals.costUsd * 2 - bulk.totals.listCostUsd) < 1e-12, 'batch price is not half');
    // What the provider batch cost was charged to the batch's budget, once.
    const budget = await local.rateLimits.budget(budgetId);
    assert.ok(
      Math.abs((budget?.spentUsd ?? 0) - bulk.totals.costUsd) < 1e-12,
      `budget spent ${budget?.spentUsd}`,
    );
    assert.equal(budget?.spentTokens, bulk.totals.inputTokens + bulk.totals.outputTokens);
    // Each document's steps carry the batch's claim and the one-by-one cost beside their own.
    const results = await documentResults(progress.handled.map((h) => h.workflowId));
    assert.equal(results.length, 6);
    for (const r of results) {
      for (const step of [r.summary, r.tags]) {
        assert.ok(step.bulk !== undefined, 'a step result does not say it came from a provider batch');
        assert.equal(step.memoised, true);
        assert.ok(Math.abs((step.estimatedCostUsd ?? 0) * 2 - (step.bulk.listCostUsd ?? 0)) < 1e-12);
      }
      assert.equal(r.publication?.revision, 1);
    }
  });

  it('sends what a round left unanswered (errors, refused answers) in a second provider batch, quoting the refusal, and pays no answer twice', async () => {
    // The first batch answers lines 0, 5, 10 with an error, and refuses lines 3 and 8 (malformed JSON, or cut off).
    const { server, local } = await bulkSetup(defer, 'anthropic', {
      completeAtLook: 2,
      fault: ({ batchSeq, index }) =>
        batchSeq !== 1 ? undefined : index % 5 === 0 ? 'error' : index % 5 === 3 ? 'refuse' : undefined,
    });
    const folder = documentFolder(defer, 6);
    const taskQueue = `bulk-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const progress = await worker.runUntil(async () => {
      const { handle } = await startBulkBatch(env.client, local.blobs, folder, taskQueue, { rounds: 2 });
      return resultWithin(handle, 90_000);
    });
    assert.equal(progress.tally.done, 6);
    assert.equal(progress.tally.memoised, 12);
    assert.equal(server.direct.length, 0, 'a document step called the model');
    const [first, second] = server.batches;
    assert.equal(server.batches.length, 2);
    const retried = first!.lines.filter((l) => l.outcome !== 'answered').map((l) => l.customId);
    assert.equal(retried.length, 5);
    assert.deepEqual(second!.lines.map((l) => l.customId).sort(), [...retried].sort());
    // A refused answer's retry quotes why it was refused; an errored request goes again as it was.
    const refusedIds = new Set(first!.lines.filter((l) => l.outcome === 'refused').map((l) => l.customId));
    for (const line of second!.lines)
      assert.equal(
        JSON.stringify(line.body).includes('Your previous answer to this request was refused'),
        refusedIds.has(line.customId),
      );
    const counts = serverCounts(server);
    assert.deepEqual(counts.answeredTwice, []);
    assert.deepEqual(counts.inTwoLiveBatches, []);
    // The refused answers were paid, and count in the cost.
    assert.equal(progress.bulk?.totals.refused, 2);
    assert.equal(progress.bulk?.totals.errored, 3);
    assert.equal(progress.bulk?.totals.answered, 12);
    assert.equal(counts.paid, 14);
  });

  it("leaves what an expired batch did not answer to the documents' own calls, which pay for nothing answered", async () => {
    // The batch expires with its first 5 of 12 lines answered.
    const { server, local } = await bulkSetup(defer, 'anthropic', { completeAtLook: 2, expire: () => 5 });
    const folder = documentFolder(defer, 6);
    const taskQueue = `bulk-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const progress = await worker.runUntil(async () => {
      const { handle } = await startBulkBatch(env.client, local.blobs, folder, taskQueue, { rounds: 1 });
      return resultWithin(handle, 90_000);
    });
    assert.equal(progress.tally.done, 6);
    assert.equal(progress.tally.failed, 0);
    assert.equal(progress.bulk?.totals.answered, 5);
    assert.equal(progress.bulk?.totals.expired, 7);
    assert.equal(server.batches[0]?.status, 'ended');
    // The 7 expired requests were called one by one, and only those: 5 answers reused from the memo.
    assert.equal(server.direct.length, 7);
    assert.equal(progress.tally.memoised, 5);
  });

  it('cancels the provider batch when the batch is cancelled, and keeps what it answered before the cancel', async () => {
    const { server, local } = await bulkSetup(defer, 'openai', { completeAtLook: 1_000 });
    const folder = documentFolder(defer, 4);
    const taskQueue = `bulk-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const memoBefore = await local.memo.count();
    await worker.runUntil(async () => {
      const { handle } = await startBulkBatch(env.client, local.blobs, folder, taskQueue, {});
      // Cancelled while the batch waits for the provider (the workflow between two looks).
      const deadline = Date.now() + 30_000;
      // A query sent as the batch starts may fail on the time-skipping server (a fresh-clone run saw 'Failed to
      // query Workflow' once, likely before the batch's first task set its handler): it is asked again, within the
      // same deadline.
      const phase = (): Promise<string | undefined> =>
        handle.query(batchProgressQuery).then(
          (progress) => progress.bulk?.phase,
          () => undefined,
        );
      while ((await phase()) !== 'waiting') {
        assert.ok(Date.now() < deadline, 'the batch never came to wait for its provider batch');
        await new Promise((r) => setTimeout(r, 50));
      }
      await handle.cancel();
      await assert.rejects(resultWithin(handle, 90_000), /cancel/i);
    });
    const batch = server.batches[0];
    assert.equal(server.batches.length, 1);
    assert.equal(batch?.status, 'cancelled');
    assert.ok(server.calls.some((c) => c.action === 'cancel'));
    // The provider answered half before the cancel took: those answers are in the memo, paid once.
    const answered = batch?.lines.filter((l) => l.outcome === 'answered').length ?? 0;
    assert.equal(answered, 4);
    assert.equal((await local.memo.count()) - memoBefore, answered);
  });
});
