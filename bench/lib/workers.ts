import '../../src/cli/compose';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { temporal } from '@temporalio/proto';
import { documentPipeline } from '../../workflows';
import { loadConfig } from '../../src/config';
import { INPUT_SCHEMA_VERSION } from '../../src/contract';
import { createDependencies } from '../../src/dependencies';
import { prebuiltBundle, WORKFLOW_BUNDLE_PATH } from '../../src/temporal/bundle';
import { createPipelineWorker } from '../../src/temporal/worker';
import { bundleFromSource } from './bundle';
import { round } from './rows';
import type { Server } from './server';

const ROOT = path.resolve(__dirname, '..', '..');

/** Worker.create to polling: bundling the workflows from source, against loading the prebuilt bundle. */
export async function coldStart(
  server: Server,
  deps: Parameters<typeof createPipelineWorker>[0]['deps'],
  taskQueue: string,
): Promise<{ fromSourceMs: number; fromBundleMs: number }> {
  // What a worker does at start either way: bundle the workflows from source, or load the prebuilt file.
  const time = async (bundle: () => Promise<{ code: string } | { codePath: string }>): Promise<number> => {
    const t = performance.now();
    const worker = await createPipelineWorker({
      connection: server.env.nativeConnection,
      namespace: 'default',
      taskQueue: `${taskQueue}-cold`,
      deps,
      workflowBundle: await bundle(),
    });
    const ms = performance.now() - t;
    await worker.runUntil(sleep(100));
    return round(ms, 0);
  };
  const fromSourceMs = await time(async () => ({
    code: await bundleFromSource(require.resolve('../../workflows')),
  }));
  if (prebuiltBundle(require.resolve('../../workflows')) === undefined) await runBuild();
  return { fromSourceMs, fromBundleMs: await time(async () => ({ codePath: WORKFLOW_BUNDLE_PATH })) };
}

async function runBuild(): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'scripts', 'build.ts')], {
      stdio: 'ignore',
    });
    child.once('exit', (code) =>
      code === 0 ? resolve() : reject(new Error(`npm run build exited ${code}`)),
    );
  });
}

/**
 * Two worker processes; a document whose summarize takes 4 s; SIGKILL the worker running it; time until the step's
 * next attempt runs on the other. Bounded by the heartbeat timeout (10 s): that is how long Temporal waits before it
 * decides a silent worker is dead.
 */
export async function killToResume(server: Server, dataDir: string): Promise<number | undefined> {
  const taskQueue = 'bench-kill';
  const env = {
    ...process.env,
    TEMPORAL_ADDRESS: server.address,
    TEMPORAL_TASK_QUEUE: taskQueue,
    DATA_DIR: dataDir,
    OFFLINE_MODEL_LATENCY_MS: '4000',
    LOG_LEVEL: 'error',
    // Two workers run at once: one METRICS_PORT from the shell would let only the first of them start.
    METRICS_PORT: '',
  };
  const workers = [0, 1].map(() =>
    spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'worker.ts')], {
      env,
      stdio: 'ignore',
    }),
  );
  try {
    const client = server.env.client;
    for (let i = 0; i < 300; i++) {
      const queue = await client.workflowService.describeTaskQueue({
        namespace: 'default',
        taskQueue: { name: taskQueue },
        taskQueueType: temporal.api.enums.v1.TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
      });
      if ((queue.pollers?.length ?? 0) >= 2) break;
      await sleep(100);
    }
    const config = loadConfig({ DATA_DIR: dataDir });
    const parts = await createDependencies(config);
    const textRef = await parts.stores.blobs.put(
      Buffer.from('# Kill\n\nA worker dies in the middle of this step.'),
    );
    await parts.close();
    const handle = await client.workflow.start(documentPipeline, {
      taskQueue,
      workflowId: 'bench-kill-document',
      args: [{ schemaVersion: INPUT_SCHEMA_VERSION, documentId: 'bench-kill', textRef, title: 'Kill' }],
    });
    const runningOn = async (): Promise<{ identity: string; attempt: number } | undefined> => {
      const described = await client.workflowService.describeWorkflowExecution({
        namespace: 'default',
        execution: { workflowId: handle.workflowId },
      });
      const step = described.pendingActivities?.find(
        (a) =>
          a.activityId === 'summarize' &&
          a.state === temporal.api.enums.v1.PendingActivityState.PENDING_ACTIVITY_STATE_STARTED,
      );
      return step ? { identity: step.lastWorkerIdentity ?? '', attempt: step.attempt ?? 1 } : undefined;
    };
    let first: { identity: string; attempt: number } | undefined;
    while ((first = await runningOn()) === undefined) await sleep(20);
    const victim = workers.find((w) => first?.identity.startsWith(`${w.pid}@`));
    if (victim === undefined) return undefined;
    const killedAt = performance.now();
    victim.kill('SIGKILL');
    for (;;) {
      const now = await runningOn();
      if (now !== undefined && now.attempt > first.attempt) return round(performance.now() - killedAt, 0);
      await sleep(20);
    }
  } finally {
    for (const w of workers) w.kill('SIGKILL');
  }
}
