/**
 * The project's own cost per step, measured in pairs. Each document of the corpus, one at a time, is timed three
 * ways back to back: the model's work on it in this process (summarize, then tag), the pipeline (started eagerly),
 * and the busy yardstick, whose summarize and tag are the model's own scoring of the document on a thread, and
 * nothing else (bench/lib/temporal-alone.ts). The two runs go in turn first, so a drift of the machine between them
 * falls on both sides alike, and the document's own cost is their difference over its three steps: what the
 * project's code costs on top of Temporal running the same shape, with the same gaps between the steps.
 *
 * The no-op yardstick (activities that return at once) is the other reading, kept in the table: its summarize and
 * tag end together, so its run has one workflow task fewer than a run whose steps take time, and that task's cost
 * (Temporal's, for the shape) counts as the project's there.
 */
import type { Client } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import { documentPipeline } from '../../workflows';
import { INPUT_SCHEMA_VERSION, PipelineOptionsSchema, workflowIdFor } from '../../src/contract';
import { RequestThread } from '../../src/lib/thread';
import type { OfflineRequest } from '../../src/model/offline-nlp';
import { atOnce, percentile, round, STEPS_PER_DOCUMENT, timedRow } from './rows';
import type { Doc, Row } from './rows';
import { eventMs } from './breakdown';
import type { PhaseRecorder } from './breakdown';
import type { Server } from './server';
import { runBusySteps, yardstickWorker } from './temporal-alone';
import { emptySteps, emptyStepsPatched } from './workflows';
import { summarizeRequest } from '../../test/requests';
import { tagRequest } from '../../test/requests';

const OPTIONS = PipelineOptionsSchema.parse({});

/** Runs one document through the pipeline, started eagerly with a complete input, as our clients send it. */
export async function executeDocument(
  client: Client,
  taskQueue: string,
  documentId: string,
  textRef: string,
  title: string,
): Promise<number> {
  const t = performance.now();
  await client.workflow.execute(documentPipeline, {
    taskQueue,
    workflowId: workflowIdFor(documentId),
    requestEagerStart: true,
    args: [{ schemaVersion: INPUT_SCHEMA_VERSION, documentId, textRef, title, options: OPTIONS }],
  });
  return performance.now() - t;
}

/** A thread that scores as the model's own does, and answers how long it took (model-timing-thread.ts). */
const timing = new RequestThread<OfflineRequest, number>(
  "the benchmark's model timing thread",
  require.resolve('./model-timing-thread'),
);

/**
 * The model's time on one document: its scoring on a thread of its own, timed there (summary first, so the tags
 * reuse its analysis as they do in the model's thread): the work the rows' per-step overhead leaves out. Not timed
 * around a call to the model, which would count the messages there and back; nor on this thread, whose heap the
 * scoring's garbage would leave to the runs that follow.
 */
async function modelTimes(doc: Doc): Promise<{ summarize: number; tag: number }> {
  const summarize = await timing.call({
    ...summarizeRequest(OPTIONS.maxSummarySentences).offline,
    text: doc.text,
  });
  const tag = await timing.call({ ...tagRequest(OPTIONS.maxTags).offline, text: doc.text });
  return { summarize, tag };
}

export interface PairedOwnCost {
  pipeline: Row;
  yardstick: Row;
  /** Per document: (pipeline - busy yardstick) / 3, p50 and p95. */
  ownCostMsPerStepP50: number;
  ownCostMsPerStepP95: number;
  /** The p50 of each pass over the corpus alone: how much one reading moves within a run. */
  ownCostMsPerStepP50ByPass: number[];
  /** Each pass's durable commit where the steps make it (the memo answer's phase, p50), when a phase timer was given. */
  durableCommitMsP50ByPass: number[];
  /** Each pass's p50 of a document's run, in the pipeline and in the busy yardstick: which side moves from pass to pass. */
  msPerDocP50ByPass: { pipeline: number[]; yardstick: number[] };
  /** What carrying the pipeline's patch costs a run, per step, p50, and the own cost less it (see patchMsPerStep). */
  patchMsPerStepP50: number;
  ownCostMsPerStepP50BesidePatch: number;
  /** Each document's model times (the rows' per-step overhead leaves them out); the busy yardstick runs its keys. */
  modelMs: ReadonlyMap<Doc, { summarize: number; tag: number }>;
  /** Where the difference lies in a run: its histories' segments, pipeline and yardstick (see historySplit). */
  historySplitMsPerDoc: Record<Segment, { pipeline: number; yardstick: number; difference: number }>;
}

/** A run's segments, from its history's event times, in the order they follow one another. */
const SEGMENTS = [
  'first workflow task',
  'summarize and tag',
  'workflow task after them',
  'publish',
  'last workflow task',
] as const;
type Segment = (typeof SEGMENTS)[number];

const { EventType } = temporal.api.enums.v1;

/**
 * A run's history cut where the pipeline's shape turns: the first workflow task completed, the second activity
 * completed (summarize and tag both done), the third activity scheduled and completed (publish), the run closed.
 * Undefined for a history of another shape (a step that failed and was retried).
 */
export function segmentsOf(history: temporal.api.history.v1.IHistory): Record<Segment, number> | undefined {
  const events = history.events ?? [];
  const nth = (type: temporal.api.enums.v1.EventType, n: number) =>
    eventMs(events.filter((e) => e.eventType === type)[n - 1]);
  const cuts = [
    eventMs(events[0]),
    nth(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 1),
    nth(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, 2),
    nth(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, 3),
    nth(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, 3),
    eventMs(events.at(-1)),
  ];
  if (cuts.some((t) => t === undefined)) return undefined;
  if (events.filter((e) => e.eventType === EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED).length !== 3)
    return undefined;
  const at = cuts as number[];
  return Object.fromEntries(SEGMENTS.map((name, k) => [name, (at[k + 1] ?? 0) - (at[k] ?? 0)])) as Record<
    Segment,
    number
  >;
}

/**
 * Where a pair's difference lies: each segment's p50 over the first pass's pairs, in the pipeline, in the yardstick,
 * and the p50 of the pairs' differences (which need not add up to the whole's p50).
 */
async function historySplit(
  client: Client,
  pairs: ReadonlyArray<{ pipeline: string; yardstick: string }>,
): Promise<PairedOwnCost['historySplitMsPerDoc']> {
  const split = SEGMENTS.map(() => ({
    pipeline: [] as number[],
    yardstick: [] as number[],
    difference: [] as number[],
  }));
  for (const pair of pairs) {
    const [p, y] = await Promise.all(
      [pair.pipeline, pair.yardstick].map(async (id) =>
        segmentsOf(await client.workflow.getHandle(id).fetchHistory()),
      ),
    );
    if (p === undefined || y === undefined) continue;
    for (const [k, name] of SEGMENTS.entries()) {
      split[k]?.pipeline.push(p[name]);
      split[k]?.yardstick.push(y[name]);
      split[k]?.difference.push(p[name] - y[name]);
    }
  }
  const p50 = (values: number[]) => round(percentile(values, 50), 2);
  return Object.fromEntries(
    SEGMENTS.map((name, k) => {
      const s = split[k] ?? { pipeline: [], yardstick: [], difference: [] };
      return [
        name,
        { pipeline: p50(s.pipeline), yardstick: p50(s.yardstick), difference: p50(s.difference) },
      ];
    }),
  ) as PairedOwnCost['historySplitMsPerDoc'];
}

/** From a run's start to its first activity scheduled: its first workflow task, and the commands it sent. */
export function untilFirstStep(history: temporal.api.history.v1.IHistory): number | undefined {
  const events = history.events ?? [];
  const first = events.find((e) => e.eventType === EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED);
  const [start, end] = [eventMs(events[0]), eventMs(first)];
  return start === undefined || end === undefined ? undefined : end - start;
}

/**
 * What Temporal charges a run for carrying the pipeline's one patch: `count` pairs of the no-op yardstick with the
 * patch and without it (emptyStepsPatched, emptySteps), on the yardstick's worker, each first in turn, after the
 * passes (so the pairs' runs are as before). The `patched()` call's marker and the search-attribute upsert the SDK
 * sends with it both come before the first step is scheduled, so the difference of that stretch of the two
 * histories is the patch's, with nothing of the steps in it. Per step, p50 of the pairs.
 */
async function patchMsPerStep(client: Client, taskQueue: string, count: number): Promise<number> {
  const stretch = async (workflow: typeof emptySteps, workflowId: string): Promise<number | undefined> => {
    await client.workflow.execute(workflow, { taskQueue, workflowId, requestEagerStart: true });
    return untilFirstStep(await client.workflow.getHandle(workflowId).fetchHistory());
  };
  const differences: number[] = [];
  for (let i = 0; i < count; i++) {
    const id = `${taskQueue}-patch-${i}`;
    const plainFirst = i % 2 === 0;
    const before = plainFirst ? await stretch(emptySteps, `${id}-plain`) : undefined;
    const patched = await stretch(emptyStepsPatched, `${id}-patched`);
    const plain = plainFirst ? before : await stretch(emptySteps, `${id}-plain`);
    if (plain !== undefined && patched !== undefined) differences.push(patched - plain);
  }
  return percentile(differences, 50) / STEPS_PER_DOCUMENT;
}

/** The pairs, over `docs`, on a pipeline worker already polling `taskQueue` (and a yardstick worker of its own). */
export async function pairedOwnCost(
  server: Server,
  client: Client,
  taskQueue: string,
  textRefs: ReadonlyMap<Doc, string>,
  docs: readonly Doc[],
  label: string,
  passes: number,
  /** The pipeline worker's phase timer: each pass's durable commit (the memo answer's phase) is read off it. */
  phases?: PhaseRecorder,
): Promise<PairedOwnCost> {
  const yardstickQueue = `bench-busy-steps-${label}`;
  const { worker } = await yardstickWorker(server, yardstickQueue);
  const pipelineMs: number[] = [];
  const yardstickMs: number[] = [];
  const pipelineOverhead: number[] = [];
  const yardstickOverhead: number[] = [];
  const own: number[] = [];
  const modelMs = new Map<Doc, { summarize: number; tag: number }>();
  const byPass: number[] = [];
  const commitByPass: number[] = [];
  const runsByPass = { pipeline: [] as number[], yardstick: [] as number[] };
  const firstPass: Array<{ pipeline: string; yardstick: string }> = [];
  let patch = NaN;
  // The timing thread warmed first (wink loads its model on first use), as the model's thread is by now.
  for (const doc of docs.slice(0, 3)) await modelTimes(doc);
  await worker.runUntil(async () => {
    for (let pass = 0; pass < passes; pass++) {
      phases?.reset();
      const ownThisPass: number[] = [];
      const runsThisPass = { pipeline: [] as number[], yardstick: [] as number[] };
      for (const [n, doc] of docs.entries()) {
        const i = pass * docs.length + n;
        const times = await modelTimes(doc);
        modelMs.set(doc, times);
        const work = times.summarize + times.tag;
        const documentId = `bench-${label}-paired-${pass}:${doc.name}`;
        const yardstickId = `bench-busy-steps-${label}-${i}`;
        if (pass === 0) firstPass.push({ pipeline: workflowIdFor(documentId), yardstick: yardstickId });
        const pipeline = () =>
          executeDocument(client, taskQueue, documentId, textRefs.get(doc) ?? '', doc.name);
        const yardstick = () => runBusySteps(client, yardstickQueue, yardstickId, doc);
        let p: number;
        let y: number;
        if (i % 2 === 0) {
          p = await pipeline();
          y = await yardstick();
        } else {
          y = await yardstick();
          p = await pipeline();
        }
        pipelineMs.push(p);
        yardstickMs.push(y);
        pipelineOverhead.push((p - work) / STEPS_PER_DOCUMENT);
        yardstickOverhead.push((y - work) / STEPS_PER_DOCUMENT);
        own.push((p - y) / STEPS_PER_DOCUMENT);
        ownThisPass.push((p - y) / STEPS_PER_DOCUMENT);
        runsThisPass.pipeline.push(p);
        runsThisPass.yardstick.push(y);
      }
      byPass.push(round(percentile(ownThisPass, 50), 2));
      runsByPass.pipeline.push(round(percentile(runsThisPass.pipeline, 50), 2));
      runsByPass.yardstick.push(round(percentile(runsThisPass.yardstick, 50), 2));
      const commit = phases?.summary(docs.length, STEPS_PER_DOCUMENT)['memo answer']?.p50Ms;
      if (commit !== undefined) commitByPass.push(commit);
    }
    patch = await patchMsPerStep(client, yardstickQueue, docs.length);
  });
  const seconds = (times: number[]) => times.reduce((a, b) => a + b, 0) / 1000;
  return {
    pipeline: timedRow(
      'pipeline, one document at a time, eager start, paired with the busy yardstick',
      1,
      pipelineMs,
      pipelineOverhead,
      seconds(pipelineMs),
    ),
    yardstick: timedRow(
      "Temporal alone: the same three steps, summarize and tag busy for the model's time, paired",
      1,
      yardstickMs,
      yardstickOverhead,
      seconds(yardstickMs),
    ),
    ownCostMsPerStepP50: round(percentile(own, 50), 2),
    ownCostMsPerStepP95: round(percentile(own, 95), 2),
    ownCostMsPerStepP50ByPass: byPass,
    durableCommitMsP50ByPass: commitByPass,
    msPerDocP50ByPass: runsByPass,
    patchMsPerStepP50: round(patch, 2),
    ownCostMsPerStepP50BesidePatch: round(percentile(own, 50) - patch, 2),
    modelMs,
    historySplitMsPerDoc: await historySplit(client, firstPass),
  };
}

/**
 * The busy yardstick, `concurrency` documents at once: Temporal running the pipeline's shape with the model's
 * scoring on a thread of its own, as the offline model's, and nothing of the project's: the ceiling measured, beside
 * the modelled one.
 */
export async function busyCeiling(
  server: Server,
  client: Client,
  modelMs: ReadonlyMap<Doc, { summarize: number; tag: number }>,
  concurrency: number,
  /** Sets this run's workflow IDs apart from another's at the same concurrency. */
  suffix = '',
  /** Runs the documents' span (the worker started, not yet stopped): the CPU profiler, say. */
  around: (work: () => Promise<number>) => Promise<number> = (work) => work(),
): Promise<Row> {
  const taskQueue = `bench-busy-steps-c${concurrency}${suffix}`;
  const { worker } = await yardstickWorker(server, taskQueue);
  const docs = [...modelMs.keys()];
  const perDoc: number[] = [];
  const overhead: number[] = [];
  const seconds = await worker.runUntil(() =>
    around(() =>
      atOnce(docs.length, concurrency, async (i) => {
        const doc = docs[i];
        if (doc === undefined) return;
        const times = modelMs.get(doc) ?? { summarize: 0, tag: 0 };
        const ms = await runBusySteps(client, taskQueue, `${taskQueue}-${i}`, doc);
        perDoc.push(ms);
        overhead.push((ms - times.summarize - times.tag) / STEPS_PER_DOCUMENT);
      }),
    ),
  );
  return timedRow(
    "Temporal alone: the same three steps, summarize and tag busy for the model's time",
    concurrency,
    perDoc,
    overhead,
    seconds,
  );
}
