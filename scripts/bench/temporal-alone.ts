import { Worker } from '@temporalio/worker';
import { RequestThread } from '../../src/lib/thread';
import type { Client } from '@temporalio/client';
import { busySteps, emptySteps } from './workflows';
import { bundleFromSource } from './bundle';
import { atOnce, STEPS_PER_DOCUMENT, timedRow } from './rows';
import type { Row } from './rows';
import type { Server } from './server';
import type { temporal } from '@temporalio/proto';

/** The thread the busy yardstick's steps hold, one step at a time, as the offline model's steps hold its own. */
const spinner = new RequestThread<{ ms: number }, number>(
  "the busy yardstick's thread",
  require.resolve('./spin-thread'),
);

/**
 * The yardsticks' activities: nothing, or a thread held for `ms` (the offline model's time on that step), the
 * worker's event loop free meanwhile, as the offline model's own thread leaves it.
 */
const activities = {
  nothing: async (): Promise<void> => {},
  busy: async (ms: number): Promise<void> => {
    await spinner.call({ ms });
  },
};

let yardstickCode: Promise<string> | undefined;

/** A worker for the yardsticks, with the SDK's defaults for everything else, as the pipeline's worker has. */
export async function yardstickWorker(
  server: Server,
  taskQueue: string,
): Promise<{ worker: Worker; code: string }> {
  // Bundled once per process: a worker per row, and some rows run several times.
  const code = await (yardstickCode ??= bundleFromSource(require.resolve('./workflows')));
  const worker = await Worker.create({
    connection: server.env.nativeConnection,
    namespace: 'default',
    taskQueue,
    workflowBundle: { code },
    activities,
  });
  return { worker, code };
}

/**
 * Temporal alone: `count` workflows of the pipeline's shape whose activities do nothing, `concurrency` at once,
 * each started eagerly as the eager row above: a document's time here is all overhead, the floor under the
 * pipeline's, and the docs/s at the largest concurrency is the ceiling over it on this machine.
 */
export async function runEmptySteps(
  server: Server,
  client: Client,
  count: number,
  concurrency: number,
  /** Sets this run's workflow IDs apart from another's at the same concurrency. */
  suffix = '',
): Promise<{ row: Row; histories: temporal.api.history.v1.IHistory[]; code: string }> {
  const taskQueue = `bench-empty-steps-c${concurrency}${suffix}`;
  const { worker, code } = await yardstickWorker(server, taskQueue);
  const perDoc: number[] = [];
  const seconds = await worker.runUntil(() =>
    atOnce(count, concurrency, async (i) => {
      const t = performance.now();
      await client.workflow.execute(emptySteps, {
        taskQueue,
        workflowId: `${taskQueue}-${i}`,
        requestEagerStart: true,
      });
      perDoc.push(performance.now() - t);
    }),
  );
  const perStep = perDoc.map((ms) => ms / STEPS_PER_DOCUMENT);
  const name = 'Temporal alone: the same three steps doing nothing, eager start';
  const histories = await Promise.all(
    Array.from({ length: count }, (_, i) => client.workflow.getHandle(`${taskQueue}-${i}`).fetchHistory()),
  );
  return { row: timedRow(name, concurrency, perDoc, perStep, seconds), histories, code };
}

/** Runs one document's shape in the busy yardstick: summarize and tag hold the thread as long as the model did. */
export async function runBusySteps(
  client: Client,
  taskQueue: string,
  workflowId: string,
  modelMs: { summarize: number; tag: number },
): Promise<number> {
  const t = performance.now();
  await client.workflow.execute(busySteps, {
    taskQueue,
    workflowId,
    requestEagerStart: true,
    args: [modelMs.summarize, modelMs.tag],
  });
  return performance.now() - t;
}
