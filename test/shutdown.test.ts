/**
 * A deploy is a SIGTERM. The worker must let the model call in flight finish (within its shutdown grace) and
 * report it, so the next worker finds the step recorded instead of paying for the call again.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { recoveryReport } from '../src/runs/history';
import {
  completion,
  devServerEnv,
  installQuietRuntime,
  modelServerFor,
  pipelineInput,
  SAMPLE_TEXT,
  startCrashableWorker,
  startPipeline,
  tempParts,
  writeWorkflowBundle,
} from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

installQuietRuntime();
const defer = cleanupAfterAll();
/** The model answers this long after a call arrives; SIGTERM lands in the middle. */
const MODEL_LATENCY_MS = 4_000;

describe('SIGTERM during a model call', () => {
  let env: TestWorkflowEnvironment;
  let bundlePath: string;

  before(async () => {
    env = await devServerEnv();
    defer(() => env.teardown());
    bundlePath = await writeWorkflowBundle(scratchDir(defer, 'shutdown-bundle-'));
  });

  it(
    'lets the call finish and records the step: the model server sees one call per step',
    { timeout: 120_000 },
    async () => {
      const server = await modelServerFor(defer, (request) => ({
        body: completion(request.step === 'tag' ? '{"tags": ["deploys"]}' : 'Deploys must not pay twice.'),
        delayMs: MODEL_LATENCY_MS,
      }));
      const local = await tempParts(defer);
      const taskQueue = `shutdown-${randomUUID()}`;
      const workerEnv = (identity: string): Record<string, string> => ({
        TEMPORAL_ADDRESS: env.address,
        TEMPORAL_NAMESPACE: env.namespace ?? 'default',
        TEMPORAL_TASK_QUEUE: taskQueue,
        DATA_DIR: local.dir,
        OPENAI_BASE_URL: server.baseUrl,
        OPENAI_MODEL: 'test-model',
        WORKFLOW_BUNDLE_PATH: bundlePath,
        WORKER_IDENTITY: identity,
      });
      const first = await startCrashableWorker(workerEnv('deployed-worker-1'));
      defer(async () => void (await first.kill()));
      const handle = await startPipeline(env, taskQueue, await pipelineInput(local.blobs, SAMPLE_TEXT));

      while (server.open().length < 2) await sleep(50);
      first.child.kill('SIGTERM');
      const exit = await first.exited;
      assert.equal(
        exit,
        'exit 0',
        `the worker should stop cleanly after its steps finished:\n${first.output()}`,
      );

      const second = await startCrashableWorker(workerEnv('deployed-worker-2'));
      defer(async () => void (await second.kill()));
      const result = await handle.result();
      const report = recoveryReport(await handle.fetchHistory());
      for (const step of report.steps.filter((s) => s.step !== 'publish')) {
        assert.equal(step.status, 'completed');
        assert.equal(step.attempts, 1, `${step.step} ran again after the SIGTERM`);
        assert.equal(
          step.worker,
          'deployed-worker-1',
          `${step.step} was not finished by the stopping worker`,
        );
      }
      const keys = server.requests.map((r) => r.idempotencyKey);
      assert.deepEqual(
        keys.sort(),
        [`${handle.firstExecutionRunId}:summarize`, `${handle.firstExecutionRunId}:tag`],
        'each model step was paid once',
      );
      assert.ok(server.requests.every((r) => r.answeredAt !== undefined && !r.cutOff));
      assert.equal(result.summary.summary, 'Deploys must not pay twice.');
    },
  );
});
