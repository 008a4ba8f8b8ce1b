/**
 * A run's history does not depend on the worker's telemetry: a review decided on a worker with tracing on replays
 * on a worker without it, and one decided without tracing replays with it (the replay `npm run check-replay` and
 * a worker restart do). Before, the tracing interceptors' extra awaits in the update's handler let the review's
 * timer be cancelled before the update completed, and the events came in another order (TimerCanceled).
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { bundleWorkflowCode, Worker } from '@temporalio/worker';
import type { WorkflowBundle } from '@temporalio/worker';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { decide } from '../src/runs/review-queue';
import { createPipelineWorker, workflowInterceptorModules } from '../src/temporal/worker';
import { startTracing, workerTracing } from '../src/telemetry/tracing';
import type { Tracing } from '../src/telemetry/tracing';
import { reviewQuery } from '../src/workflow';
import {
  devServerEnv,
  installQuietRuntime,
  pipelineInput,
  SAMPLE_TEXT,
  silentLogger,
  startPipeline,
  tempParts,
  workflowBundle,
} from './helpers';
import type { LocalParts } from './helpers';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();
installQuietRuntime();
const tracing = startTracing(new SimpleSpanProcessor(new InMemorySpanExporter()));
let env: TestWorkflowEnvironment;
let traced: WorkflowBundle;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
  traced = await bundleWorkflowCode({
    workflowsPath: require.resolve('../workflows'),
    workflowInterceptorModules: workflowInterceptorModules(tracing),
    logger: silentLogger,
  });
});

/** A run with a review, decided (approved) on a worker with tracing on or off; its history once it ended. */
async function decidedRun(local: LocalParts, withTracing: Tracing | undefined) {
  const taskQueue = `review-tracing-${randomUUID()}`;
  const worker = await createPipelineWorker({
    connection: env.nativeConnection,
    namespace: env.namespace ?? 'default',
    taskQueue,
    deps: local.deps,
    workflowBundle: withTracing === undefined ? await workflowBundle() : traced,
    tracing: withTracing,
  });
  const input = {
    ...(await pipelineInput(local.blobs, SAMPLE_TEXT)),
    review: { timeoutMinutes: 60, onTimeout: 'reject' as const },
  };
  const handle = await startPipeline(env, taskQueue, input);
  await worker.runUntil(async () => {
    const deadline = Date.now() + 60_000;
    while ((await handle.query(reviewQuery)) === undefined) {
      if (Date.now() > deadline) throw new Error('the draft never came to await review');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const answer = await decide(env.client, handle.workflowId, { action: 'approve', reviewer: 'ana' });
    assert.ok(answer.ok, JSON.stringify(answer));
    assert.equal((await handle.result()).review?.outcome, 'approved');
  });
  return { workflowId: handle.workflowId, history: await handle.fetchHistory() };
}

describe("a review's history and the worker's tracing", () => {
  it(
    'replays without tracing when decided with it, and with tracing when decided without',
    { timeout: 240_000 },
    async () => {
      const local = await tempParts(defer);
      const withIt = await decidedRun(local, tracing);
      const without = await decidedRun(local, undefined);
      const broken: string[] = [];
      for await (const replay of Worker.runReplayHistories({ workflowBundle: await workflowBundle() }, [
        withIt,
      ]))
        if (replay.error !== undefined)
          broken.push(`decided with tracing, replayed without: ${replay.error.message}`);
      for await (const replay of Worker.runReplayHistories(
        { workflowBundle: traced, sinks: workerTracing(tracing).sinks },
        [without],
      ))
        if (replay.error !== undefined)
          broken.push(`decided without tracing, replayed with: ${replay.error.message}`);
      assert.deepEqual(broken, []);
    },
  );
});
