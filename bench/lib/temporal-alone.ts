import { Worker } from '@temporalio/worker';
import { RequestThread } from '../../src/lib/thread';
import type { Client } from '@temporalio/client';
import { busySteps, emptySteps } from './workflows';
import { bundleFromSource } from './bundle';
import { atOnce, STEPS_PER_DOCUMENT, timedRow } from './rows';
import type { Doc, Row } from './rows';
import type { Server } from './server';
import type { temporal } from '@temporalio/proto';
import { PipelineOptionsSchema } from '../../src/contract';
import type { OfflineAnswer, OfflineRequest } from '../../src/model/offline-nlp';
import { summarizeRequest } from '../../test/requests';
import { tagRequest } from '../../test/requests';

/**
 * The busy yardstick's model: the offline model's own scoring, on a thread of the yardstick's, asked as the offline
 * model asks its thread (summarize and tag of a document together, sharing one analysis of its text there). It
 * does the model's CPU work, with the garbage collection and compiling that come with it, and is held up as much
 * when the server or the worker's thread takes its core: no spin stands in for it, whether timed on the wall clock
 * (which ends on time however little of it ran) or on the core (which misses the work of V8's helper threads).
 */
const scorer = new RequestThread<OfflineRequest, OfflineAnswer>(
  "the busy yardstick's model thread",
  require.resolve('../../src/model/offline-thread'),
);
const OPTIONS = PipelineOptionsSchema.parse({});

/** The texts the busy yardstick's runs name (by document name: a run's input stays as small as a text's reference). */
const texts = new Map<string, string>();

/**
 * The yardsticks' activities: nothing, or the model's scoring of one step on the yardstick's thread, the worker's
 * event loop free meanwhile, as the offline model's own thread leaves it. Nothing of the project's: no memo, no
 * stores, no checks, no answer carried back.
 */
const activities = {
  nothing: async (): Promise<void> => {},
  busy: async (name: string, step: 'summarize' | 'tag'): Promise<void> => {
    const text = texts.get(name);
    if (text === undefined) throw new Error(`the busy yardstick has no text named ${name}`);
    await scorer.call(
      step === 'summarize'
        ? { ...summarizeRequest(OPTIONS.maxSummarySentences).offline, text }
        : { ...tagRequest(OPTIONS.maxTags).offline, text },
    );
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

/** Runs one document's shape in the busy yardstick: summarize and tag are the model's scoring of `doc`, on a thread. */
export async function runBusySteps(
  client: Client,
  taskQueue: string,
  workflowId: string,
  doc: Doc,
): Promise<number> {
  texts.set(doc.name, doc.text);
  const t = performance.now();
  await client.workflow.execute(busySteps, {
    taskQueue,
    workflowId,
    requestEagerStart: true,
    args: [doc.name],
  });
  return performance.now() - t;
}
