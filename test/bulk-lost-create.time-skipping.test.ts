/**
 * A provider batch is bought once even when the answer to its create is lost on the way back (issue 40, case 12):
 * the provider made the batch, and the worker heard a connection reset or a gateway's 502 instead. Neither SDK sends
 * an idempotency key, so a create sent again by the SDK's own retries is a second batch, every answer bought twice.
 * The local batch API server (demo/batch-server.ts) loses the answer after it made the batch; afterwards it runs
 * every batch it holds to its end, as the provider does whether anyone looks or not, and counts what it billed.
 * The client's closing lines (the result table's bulk lines) must say what the provider billed.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import type { LostAnswer } from '../demo/batch-server';
import { bulkLines } from '../src/runs/result-table';
import { bulkSetup, documentFolder, resultWithin, serverCounts, startBulkBatch } from './bulk-helpers';
import { installQuietRuntime, pipelineWorker, timeSkippingEnv } from './helpers';
import { cleanupAfterAll } from './scratch';

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();

before(async () => {
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
});

const DOCUMENTS = 6;
/** Two model steps a document: summarize and tag. */
const REQUESTS = DOCUMENTS * 2;

const CASES: { provider: 'openai' | 'anthropic'; action: 'create' | 'upload'; lost: LostAnswer }[] = [
  { provider: 'openai', action: 'create', lost: 'reset' },
  { provider: 'openai', action: 'create', lost: 'gateway' },
  { provider: 'anthropic', action: 'create', lost: 'reset' },
  { provider: 'anthropic', action: 'create', lost: 'gateway' },
  // The input file an OpenAI batch is made from: an upload sent twice is a file more, never a batch more.
  { provider: 'openai', action: 'upload', lost: 'reset' },
];

describe("a provider batch whose create's answer is lost", () => {
  for (const { provider, action, lost } of CASES) {
    it(`${provider}: the ${action}'s answer lost (${lost === 'reset' ? 'connection reset' : "gateway's 502"}): one provider batch, no answer bought twice, and the client says so`, async () => {
      const { server, local } = await bulkSetup(defer, provider, {
        completeAtLook: 2,
        loseAnswer: (call) => (call.action === action && call.n === 1 ? lost : undefined),
      });
      const folder = documentFolder(defer, DOCUMENTS);
      const taskQueue = `bulk-lost-${randomUUID()}`;
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      const progress = await worker.runUntil(async () => {
        const { handle } = await startBulkBatch(env.client, local.blobs, folder, taskQueue, {});
        return resultWithin(handle, 120_000);
      });
      assert.equal(
        server.calls.filter((c) => c.lost !== undefined).length,
        1,
        "the create's answer was not lost",
      );
      // Whatever nobody looked at runs out too, and is billed.
      server.runAll();
      const counts = serverCounts(server);
      const figure =
        `${provider} ${action} answer lost (${lost}): provider batches ${counts.batches}, answers bought ` +
        `${counts.paid} for ${REQUESTS} requests, answered twice ${counts.answeredTwice.length}`;
      console.log(`bulk-lost-create: ${figure}`);
      assert.equal(counts.batches, 1, figure);
      assert.equal(counts.paid, REQUESTS, figure);
      assert.deepEqual(counts.answeredTwice, [], figure);
      assert.equal(progress.tally.done, DOCUMENTS);
      assert.equal(progress.tally.memoised, REQUESTS);
      assert.equal(server.direct.length, 0, 'a document step called the model one by one');
      // The client's closing lines name the batches and the answers the provider billed, no fewer.
      const [batchesLine, costLine] = bulkLines(progress.bulk);
      assert.match(batchesLine ?? '', new RegExp(`^Bulk: ${counts.batches} provider batch\\(es\\)`));
      assert.match(costLine ?? '', new RegExp(`^Bulk: ${counts.paid} answer\\(s\\) bought`));
    });
  }
});
