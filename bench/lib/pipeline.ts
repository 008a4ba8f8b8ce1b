import '../../src/cli/compose';
import fs from 'node:fs';
import path from 'node:path';
import { Client } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import { batch } from '../../workflows';
import { BATCH_SCHEMA_VERSION } from '../../src/contract/batch';
import type { BatchEntry } from '../../src/contract/batch';
import { loadConfig } from '../../src/config';
import { workflowIdFor } from '../../src/contract';
import { createDependencies } from '../../src/dependencies';
import { prebuiltBundle } from '../../src/temporal/bundle';
import { createPipelineWorker } from '../../src/temporal/worker';
import { peakMiB } from './memory';
import { bundleFromSource } from './bundle';
import { eventMs, PhaseRecorder, replayMsPerRun, splitSummary } from './breakdown';
import { atOnce, round, STEPS_PER_DOCUMENT, timedRow } from './rows';
import type { Doc, Row } from './rows';
import { busyCeiling, executeDocument, pairedOwnCost } from './paired';
import type { PairedOwnCost } from './paired';
import { profiled } from './profile';
import { throughputRounds } from './rounds';
import { plainLoop } from './loops';
import { startServer } from './server';
import { runEmptySteps } from './temporal-alone';
import { coldStart, killToResume } from './workers';

/** What one server's runs measured: its rows, the server's peak memory and, on the tuned server, the worker timings. */
export interface PipelineRun {
  rows: Row[];
  serverPeakMiB: number | undefined;
  coldStart?: { fromSourceMs: number; fromBundleMs: number };
  killToResumeMs?: number;
  /** The own cost from pairs of runs, pipeline and busy yardstick, one document at a time (bench/lib/paired.ts). */
  paired?: PairedOwnCost;
  /** The throughput fraction, in rounds (bench/lib/rounds.ts). */
  throughput?: Awaited<ReturnType<typeof throughputRounds>>;
  /** The worker process's CPU a document, one at a time, by bucket (bench/lib/profile.ts). */
  cpuMsPerDoc?: Record<string, Record<string, number>>;
  /** The workflow bundle the worker loaded. */
  bundleKiB: number;
  /** One document at a time (eager start): the activities' phases, and each run's history split, beside the yardstick's. */
  breakdown?: {
    phases: ReturnType<PhaseRecorder['summary']>;
    pipeline: ReturnType<typeof splitSummary>;
    yardstick: ReturnType<typeof splitSummary>;
  };
}

/** Runs the corpus through one server: the batch at each concurrency, optionally one by one with eager start. */
export async function pipelineRuns(
  root: string,
  docs: readonly Doc[],
  workMs: Map<string, number>,
  options: { label: string; tuned: boolean; concurrencies: number[]; eager: boolean; extras: boolean },
): Promise<PipelineRun> {
  const server = await startServer(root, options.label, options.tuned);
  const rows: Row[] = [];
  const most = Math.max(...options.concurrencies);
  // The eager rows above one at a time (the batch rows' concurrencies from 16 up), where the yardsticks run too.
  const eagerConcurrencies = options.concurrencies.filter((c) => c >= 16 || (c === most && c > 1));
  const result: PipelineRun = { rows, serverPeakMiB: undefined, bundleKiB: 0 };
  try {
    const config = loadConfig({ DATA_DIR: path.join(server.dir, 'data'), TEMPORAL_ADDRESS: server.address });
    const parts = await createDependencies(config);
    const taskQueue = `bench-${options.label}`;
    const bundle = prebuiltBundle(require.resolve('../../workflows')) ?? {
      code: await bundleFromSource(require.resolve('../../workflows')),
    };
    result.bundleKiB = Math.round(
      ('code' in bundle ? bundle.code.length : fs.statSync(bundle.codePath).size) / 1024,
    );
    // The activities' phases are timed for the breakdown (the phase-timing interceptor, src/telemetry/phases.ts;
    // off in every worker of the project).
    const phases = new PhaseRecorder();
    const worker = await createPipelineWorker({
      connection: server.env.nativeConnection,
      namespace: 'default',
      taskQueue,
      deps: parts.deps,
      workflowBundle: bundle,
      phases,
    });
    // A client on the worker's own connection: the server may hand a started workflow's first task straight back
    // to this worker (eager start), skipping a round trip through the task queue.
    const client = new Client({ connection: server.env.nativeConnection, namespace: 'default' });
    let eagerHistories: temporal.api.history.v1.IHistory[] = [];
    let phaseSummary: ReturnType<PhaseRecorder['summary']> | undefined;
    await worker.runUntil(async () => {
      for (const concurrency of options.concurrencies) {
        rows.push(await runBatch(client, parts.stores.blobs, taskQueue, docs, workMs, options, concurrency));
      }
      if (options.eager) {
        // The texts are stored first: storing one is the client's submission, not a step, and the yardstick has
        // none.
        const textRefs = new Map<Doc, string>();
        for (const doc of docs) textRefs.set(doc, await parts.stores.blobs.put(Buffer.from(doc.text)));
        phases.reset();
        const eager = await runEager(client, textRefs, taskQueue, docs, workMs, options.label, 1);
        rows.push(eager.row);
        eagerHistories = eager.histories;
        phaseSummary = phases.summary(docs.length, STEPS_PER_DOCUMENT);
        // At the batch rows' concurrencies too, from 16 up: the throughput to hold against the ceiling, without the
        // batch workflow's own work (its child starts, progress and manifest), at whichever suits the pipeline best.
        for (const concurrency of eagerConcurrencies) {
          rows.push(
            (await runEager(client, textRefs, taskQueue, docs, workMs, options.label, concurrency)).row,
          );
        }
        // Three passes in a full run: the p50 of ~330 pairs, and each pass's own beside it.
        result.paired = await pairedOwnCost(
          server,
          client,
          taskQueue,
          textRefs,
          docs,
          options.label,
          options.extras ? 3 : 1,
          phases,
        );
        rows.push(result.paired.pipeline, result.paired.yardstick);
        // The throughput fraction in rounds: the pipeline's best and the ceiling's parts back to back each round.
        const { modelMs } = result.paired;
        result.throughput = await throughputRounds(
          {
            pipeline: async (c, r) =>
              (await runEager(client, textRefs, taskQueue, docs, workMs, `${options.label}-round${r}`, c)).row
                .docsPerSecond,
            noOpYardstick: async (c, r) =>
              (await runEmptySteps(server, client, docs.length, c, `-round${r}`)).row.docsPerSecond,
            busyYardstick: async (c, r) =>
              (await busyCeiling(server, client, modelMs, c, `-round${r}`)).docsPerSecond,
            modelMsPerDoc: async () =>
              (await plainLoop(docs, fs.mkdtempSync(path.join(server.dir, 'plain-')))).msPerDoc,
          },
          eagerConcurrencies,
          options.extras ? 3 : 1,
          docs.length,
          server.pid,
        );
        // Once more under the CPU profiler, one at a time and as many at once as the largest row (apart, so that
        // its sampling slows no row of the table), and the busy yardstick the same way: what a document costs the
        // worker's main thread in each, by bucket, so that the difference says where the pipeline's own cost is.
        const perDoc = (ms: Record<string, number>) =>
          Object.fromEntries(Object.entries(ms).map(([bucket, v]) => [bucket, round(v / docs.length, 2)]));
        result.cpuMsPerDoc = {};
        for (const concurrency of new Set([1, most])) {
          const label = `${options.label}-profiled-c${concurrency}`;
          const { msByBucket } = await profiled(() =>
            runEager(client, textRefs, taskQueue, docs, workMs, label, concurrency),
          );
          result.cpuMsPerDoc[`pipeline, ${concurrency} at once`] = perDoc(msByBucket);
          let yardstick: Record<string, number> = {};
          await busyCeiling(server, client, modelMs, concurrency, '-profiled', async (work) => {
            const { result: done, msByBucket: ms } = await profiled(work);
            yardstick = ms;
            return done;
          });
          result.cpuMsPerDoc[`busy yardstick, ${concurrency} at once`] = perDoc(yardstick);
        }
      }
    });
    if (options.eager && phaseSummary !== undefined) {
      let yardstick: { histories: temporal.api.history.v1.IHistory[]; code: string } | undefined;
      // At every concurrency the eager rows ran at: the ceiling is the yardsticks' best, wherever it lies.
      for (const concurrency of new Set([1, ...eagerConcurrencies])) {
        const empty = await runEmptySteps(server, client, docs.length, concurrency);
        rows.push(empty.row);
        if (concurrency === 1) yardstick = empty;
      }
      for (const concurrency of eagerConcurrencies) {
        if (result.paired !== undefined)
          rows.push(await busyCeiling(server, client, result.paired.modelMs, concurrency));
      }
      const yardstickHistories = yardstick?.histories ?? [];
      result.breakdown = {
        phases: phaseSummary,
        pipeline: splitSummary(eagerHistories, await replayMsPerRun(bundle, eagerHistories)),
        yardstick: splitSummary(
          yardstickHistories,
          await replayMsPerRun({ code: yardstick?.code ?? '' }, yardstickHistories),
        ),
      };
    }
    if (options.extras) {
      result.coldStart = await coldStart(server, parts.deps, taskQueue);
      result.killToResumeMs = await killToResume(server, config.dataDir);
    }
    await parts.close();
  } finally {
    result.serverPeakMiB = server.pid !== undefined ? peakMiB(server.pid) : undefined;
    await server.env.teardown();
  }
  return result;
}

/** The whole corpus as one batch workflow, `concurrency` documents at once: each document's time and overhead. */
async function runBatch(
  client: Client,
  blobs: { put(bytes: Uint8Array): Promise<string> },
  taskQueue: string,
  docs: readonly Doc[],
  workMs: Map<string, number>,
  options: { label: string; tuned: boolean },
  concurrency: number,
): Promise<Row> {
  const entries: BatchEntry[] = [];
  for (const doc of docs) {
    entries.push({
      documentId: `bench-${options.label}-c${concurrency}:${doc.name}`,
      textRef: await blobs.put(Buffer.from(doc.text)),
      title: doc.name,
      source: doc.name,
    });
  }
  const manifestRef = await blobs.put(Buffer.from(JSON.stringify({ entries })));
  const started = performance.now();
  await client.workflow.execute(batch, {
    taskQueue,
    workflowId: `bench-batch-${options.label}-c${concurrency}`,
    args: [
      {
        schemaVersion: BATCH_SCHEMA_VERSION,
        manifestRef,
        total: entries.length,
        options: { window: concurrency },
      },
    ],
  });
  const seconds = (performance.now() - started) / 1000;
  // Each document's own time, from its run's first event to its last: the batch's bookkeeping is not in it.
  const perDoc: number[] = [];
  const overhead: number[] = [];
  let events = 0;
  let bytes = 0;
  await Promise.all(
    entries.map(async (entry, i) => {
      const history = await client.workflow.getHandle(workflowIdFor(entry.documentId)).fetchHistory();
      const all = history.events ?? [];
      const duration = (eventMs(all.at(-1)) ?? 0) - (eventMs(all[0]) ?? 0);
      perDoc.push(duration);
      overhead.push((duration - (workMs.get(docs[i]?.name ?? '') ?? 0)) / STEPS_PER_DOCUMENT);
      events += all.length;
      bytes += temporal.api.history.v1.History.encode(history).finish().length;
    }),
  );
  return {
    ...timedRow(
      `pipeline, batch workflow, ${options.tuned ? 'tuned' : 'default'} server`,
      concurrency,
      perDoc,
      overhead,
      seconds,
    ),
    historyEventsPerDoc: round(events / entries.length),
    historyBytesPerDoc: Math.round(bytes / entries.length),
  };
}

/**
 * Documents started eagerly by a client on the worker's connection, `concurrency` at once, each timed from start to
 * result, as the yardstick's are (bench/lib/temporal-alone.ts).
 */
async function runEager(
  client: Client,
  textRefs: ReadonlyMap<Doc, string>,
  taskQueue: string,
  docs: readonly Doc[],
  workMs: Map<string, number>,
  label: string,
  concurrency: number,
): Promise<{ row: Row; histories: temporal.api.history.v1.IHistory[] }> {
  const documentId = (doc: Doc) => `bench-${label}-eager-c${concurrency}:${doc.name}`;
  const perDoc: number[] = [];
  const overhead: number[] = [];
  const seconds = await atOnce(docs.length, concurrency, async (i) => {
    const doc = docs[i];
    if (doc === undefined) return;
    const duration = await executeDocument(
      client,
      taskQueue,
      documentId(doc),
      textRefs.get(doc) ?? '',
      doc.name,
    );
    perDoc.push(duration);
    overhead.push((duration - (workMs.get(doc.name) ?? 0)) / STEPS_PER_DOCUMENT);
  });
  const histories =
    concurrency === 1
      ? await Promise.all(
          docs.map((doc) => client.workflow.getHandle(workflowIdFor(documentId(doc))).fetchHistory()),
        )
      : [];
  const path =
    concurrency === 1
      ? 'pipeline, one document at a time, eager start, tuned server'
      : 'pipeline, eager start, tuned server';
  return { row: timedRow(path, concurrency, perDoc, overhead, seconds), histories };
}
