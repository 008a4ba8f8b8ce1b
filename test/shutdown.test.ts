/**
 * A deploy is a SIGTERM. The worker must let the model call in flight finish (within its shutdown grace) and
 * report it, so the next worker finds the step recorded instead of paying for the call again: whether the signal
 * reaches its node process alone or, relayed and repeated, every process of `npm run worker`.
 */
import '../src/cli/compose';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { startWorkerProcess } from '../demo/worker-process';
import { recoveryReport } from '../src/runs/history';
import { drainOnSignals } from '../src/temporal/shutdown';
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

  const deploys = {
    'SIGTERM to the worker process': async (env: Record<string, string>) => {
      const worker = await startCrashableWorker(env);
      return { worker, deploy: () => worker.child.kill('SIGTERM') };
    },
    // systemd's KillMode=control-group, a terminal's Ctrl-C, kill -- -PGID: npm, tsx and node each get it, and npm
    // and tsx relay it to node again; a second deploy signals the group again a moment later.
    'SIGTERM to the whole process group of `npm run worker`, twice': async (env: Record<string, string>) => {
      const worker = await startWorkerProcess({ ...process.env, ...env }, { viaNpm: true });
      const group = -(worker.child.pid ?? 0);
      return {
        worker,
        deploy: () => {
          process.kill(group, 'SIGTERM');
          setTimeout(() => {
            signalGroup(group, 'SIGTERM'); // npm is gone by now (it ends at once), the worker is not
          }, 600);
        },
      };
    },
  };

  for (const [how, start] of Object.entries(deploys))
    it(
      `${how}: lets the call finish and records the step: the model server sees one call per step`,
      { timeout: 180_000 },
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
          // A limit known ahead (far above these two calls): with none, the pacing sends one call alone first to
          // learn the limits from its answer, and the two steps' calls would never be in flight together.
          MODEL_RPM: '6000',
          WORKFLOW_BUNDLE_PATH: bundlePath,
          WORKER_IDENTITY: identity,
        });
        const { worker: first, deploy } = await start(workerEnv('deployed-worker-1'));
        defer(async () => void (await first.kill()));
        const handle = await startPipeline(env, taskQueue, await pipelineInput(local.blobs, SAMPLE_TEXT));

        while (server.open().length < 2) await sleep(50);
        deploy();
        const exit = await first.exited;
        // npm ends at once on a signal to its group (npm's own way); the worker under it must drain and end cleanly.
        assert.match(exit, /^exit 0$|^npm SIGTERM, group gone$/, first.output());
        assert.match(first.output(), /stopped: the steps it finished are recorded/, first.output());

        const second = await startCrashableWorker(workerEnv('deployed-worker-2'));
        defer(async () => void (await second.kill()));
        const result = await handle.result();
        const report = recoveryReport(await handle.fetchHistory());
        for (const step of report.steps.filter((s) => s.step !== 'publish')) {
          assert.equal(step.status, 'completed');
          assert.equal(step.attempts, 1, `${step.step} ran again after the SIGTERM`);
          assert.equal(step.worker, first.identity, `${step.step} was not finished by the stopping worker`);
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

describe('drainOnSignals', () => {
  /** Runs `signals` ([name, ms after the first]) through drainOnSignals; says what the worker and the process saw. */
  function play(interactive: boolean, signals: [NodeJS.Signals, number][]) {
    let time = 0;
    const seen = { shutdowns: 0, now: 0, notes: 0 };
    const stop = drainOnSignals(
      {
        shutdown: () => void (seen.shutdowns += 1),
        getState: () => (seen.shutdowns > 0 ? 'STOPPING' : 'RUNNING'),
      },
      {
        announce: () => undefined,
        note: () => void (seen.notes += 1),
        interactive,
        now: () => void (seen.now += 1),
        clock: () => time,
      },
    );
    try {
      for (const [signal, at] of signals) {
        time = at;
        process.emit(signal, signal);
      }
    } finally {
      stop();
    }
    return seen;
  }

  it('drains once however often the signal is relayed or repeated, when no person is at a terminal', () => {
    assert.deepEqual(
      play(false, [
        ['SIGTERM', 0],
        ['SIGTERM', 300],
        ['SIGTERM', 600],
        ['SIGINT', 10_000],
      ]),
      {
        shutdowns: 1,
        now: 0,
        notes: 3,
      },
    );
  });

  it("stops now only at a person's second Ctrl-C, after the first was acknowledged, not at its relays", () => {
    assert.deepEqual(
      play(true, [
        ['SIGINT', 0],
        ['SIGINT', 300],
        ['SIGINT', 5_000],
      ]),
      {
        shutdowns: 1,
        now: 1,
        notes: 1,
      },
    );
  });
});

/** Signals a process group, if any of it is left. */
function signalGroup(group: number, signal: NodeJS.Signals): void {
  try {
    process.kill(group, signal);
  } catch {
    // The whole group has ended.
  }
}
