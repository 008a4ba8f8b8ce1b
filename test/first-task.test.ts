/**
 * A run's first workflow task, as a client that starts documentPipeline itself meets it (docs/review.md): inputs
 * with a review and no options (the run fills in the defaults), a dozen started at once, each queried for its
 * progress while it starts. A worker restart then replays every run from its history: each still answers with its
 * draft, the queue lists it, and the recorded histories replay against the bundle without a nondeterminism error.
 * Before the input was checked in the run, a local activity checked it, and the queries split the first task
 * around it: the patched() after it then fell in another task than on replay (TMPRL1100), and such runs dropped out
 * of the queue.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Worker } from '@temporalio/worker';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { INPUT_SCHEMA_VERSION } from '../src/contract';
import { awaitingReview } from '../src/runs/review-queue';
import { progressQuery, reviewQuery } from '../src/workflow';
import {
  devServerEnv,
  installQuietRuntime,
  pipelineWorker,
  SAMPLE_TEXT,
  tempParts,
  workflowBundle,
} from './helpers';
import { cleanupAfterAll } from './scratch';

const RUNS = 12;
const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

describe("a run's first task", () => {
  it(
    'replays after a worker restart for runs queried while they start, and each answers with its draft',
    { timeout: 240_000 },
    async () => {
      const local = await tempParts(defer);
      const taskQueue = `first-task-${randomUUID()}`;
      const textRef = await local.blobs.put(Buffer.from(SAMPLE_TEXT, 'utf8'));
      const first = await pipelineWorker(env, taskQueue, local.deps);
      const handles = await first.runUntil(async () => {
        const started = await Promise.all(
          Array.from({ length: RUNS }, async (_, i) => {
            const documentId = `first-task-${i}-${randomUUID()}`;
            const handle = await env.client.workflow.start('documentPipeline', {
              taskQueue,
              workflowId: `document-${documentId}`,
              // As docs/review.md invites: a review, no options (the run fills in their defaults).
              args: [
                {
                  schemaVersion: INPUT_SCHEMA_VERSION,
                  documentId,
                  textRef,
                  title: `First task ${i}`,
                  review: { timeoutMinutes: 60, onTimeout: 'reject' },
                },
              ],
            });
            // Progress asked for as the run starts, as a client following it does, until its draft is ready.
            const deadline = Date.now() + 90_000;
            for (;;) {
              await handle.query(progressQuery).catch(() => undefined);
              if ((await handle.query(reviewQuery).catch(() => undefined)) !== undefined) return handle;
              if (Date.now() > deadline) throw new Error(`${handle.workflowId}: no draft within 90 s`);
            }
          }),
        );
        return started;
      });

      // A worker restart: the next worker has none of these runs cached, and replays each from its history.
      const second = await pipelineWorker(env, taskQueue, local.deps);
      await second.runUntil(async () => {
        const answers = await Promise.all(
          handles.map((handle) =>
            env.client.withDeadline(Date.now() + 30_000, () =>
              handle.query(reviewQuery).then(
                (draft) => (draft === undefined ? `${handle.workflowId}: no draft` : undefined),
                (err: unknown) => `${handle.workflowId}: ${err instanceof Error ? err.message : String(err)}`,
              ),
            ),
          ),
        );
        const failed = answers.filter((answer) => answer !== undefined);
        assert.deepEqual(failed, [], `${failed.length} of ${RUNS} runs lost their draft after the restart`);

        // The queue lists each of them (the search attribute's index lags by a moment).
        const ids = new Set(handles.map((handle) => handle.workflowId));
        const deadline = Date.now() + 30_000;
        for (;;) {
          const queue = await awaitingReview(env.client);
          const listed = queue.filter((queued) => ids.has(queued.workflowId)).length;
          if (listed === RUNS) break;
          if (Date.now() > deadline) assert.fail(`the queue lists ${listed} of the ${RUNS} drafts`);
          await new Promise((resolve) => setTimeout(resolve, 500));
        }
      });

      const histories = await Promise.all(
        handles.map(async (handle) => ({
          workflowId: handle.workflowId,
          history: await handle.fetchHistory(),
        })),
      );
      const broken: string[] = [];
      for await (const replay of Worker.runReplayHistories(
        { workflowBundle: await workflowBundle() },
        histories,
      ))
        if (replay.error !== undefined) broken.push(`${replay.workflowId}: ${replay.error.message}`);
      assert.deepEqual(broken, [], `${broken.length} of ${RUNS} histories do not replay`);
    },
  );
});
