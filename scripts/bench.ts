/**
 * `npm run bench`: the pipeline's speed against the alternatives, measured in one run on one machine, so the
 * ratios hold even where the absolute figures do not. Runs the Rust-book corpus (../shared/corpus/rust-book) when
 * it is there, else the samples, through the same offline model:
 *
 * - a plain loop (no durability) and a SQLite checkpoint loop (synchronous FULL and NORMAL);
 * - this pipeline on a file-backed dev server: with the server's defaults, then tuned (src/temporal/tuning.ts),
 *   at 1, 4, 16 and 64 documents at once through the batch workflow, and one document at a time started eagerly;
 * - per-step overhead, history size, peak memory, worker cold start (bundle or source), and the time from a
 *   worker's SIGKILL to its step running again on another worker.
 *
 * Prints a markdown table, writes bench-results.json and bench-results.svg. A benchmark, not a test: it asserts
 * nothing and takes a few minutes. `--quick` runs 20 documents and skips the slow rows.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import { Client } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { bundleWorkflowCode, DefaultLogger, Runtime, Worker } from '@temporalio/worker';
import { batch, documentPipeline } from '../workflows';
import { emptySteps } from './bench-workflows';
import { BATCH_SCHEMA_VERSION } from '../src/batch-contract';
import type { BatchEntry } from '../src/batch-contract';
import { loadConfig } from '../src/config';
import { INPUT_SCHEMA_VERSION, PipelineOptionsSchema, workflowIdFor } from '../src/contract';
import { createDependencies } from '../src/dependencies';
import { freeLoopbackPort } from '../src/lib/loopback';
import { runMain } from '../src/lib/run-main';
import { listenerOn } from '../src/temporal/processes';
import { ensureTemporalExecutable } from '../src/temporal/binaries';
import { peakMiB } from './memory';
import { OfflineModel } from '../src/model/offline-model';
import { prebuiltBundle, WORKFLOW_BUNDLE_PATH } from '../src/temporal/bundle';
import { devServerArgs } from '../src/temporal/tuning';
import { createPipelineWorker } from '../src/temporal/worker';

const ROOT = path.resolve(__dirname, '..');
const QUICK = process.argv.includes('--quick');
const CORPUS = path.resolve(ROOT, '..', 'shared', 'corpus', 'rust-book');
const STEPS_PER_DOCUMENT = 3;

interface Doc {
  name: string;
  text: string;
}

interface Row {
  path: string;
  concurrency: number;
  docs: number;
  msPerDocP50: number;
  msPerDocP95: number;
  docsPerSecond: number;
  perStepOverheadMsP50?: number;
  perStepOverheadMsP95?: number;
  historyEventsPerDoc?: number;
  historyBytesPerDoc?: number;
}

function percentile(values: readonly number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}

const round = (n: number, digits = 1): number => Math.round(n * 10 ** digits) / 10 ** digits;

function loadCorpus(): { where: string; docs: Doc[] } {
  const dir = fs.existsSync(CORPUS) ? CORPUS : path.join(ROOT, 'samples');
  const docs = fs
    .readdirSync(dir)
    .filter((f) => /\.(md|markdown|txt)$/.test(f) && !/^README|^LICENSE/i.test(f))
    .sort()
    .map((name) => ({ name, text: fs.readFileSync(path.join(dir, name), 'utf8') }))
    .filter((d) => d.text.trim() !== '');
  return { where: path.relative(ROOT, dir), docs: QUICK ? docs.slice(0, 20) : docs };
}

// ---------------------------------------------------------------------------------------------------------------
// The alternatives: the same model work in a loop, without and with a checkpoint table
// ---------------------------------------------------------------------------------------------------------------

const model = new OfflineModel(0);
const call = (key: string) => ({ idempotencyKey: key, signal: new AbortController().signal });

async function plainLoop(
  docs: readonly Doc[],
  dir: string,
): Promise<{ row: Row; workMs: Map<string, number> }> {
  const db = new Database(path.join(dir, 'plain.db'));
  db.pragma('journal_mode = wal');
  db.exec('CREATE TABLE publications (doc TEXT PRIMARY KEY, summary TEXT, tags TEXT)');
  const publish = db.prepare('INSERT OR REPLACE INTO publications VALUES (?, ?, ?)');
  const workMs = new Map<string, number>();
  const started = performance.now();
  for (const doc of docs) {
    const t = performance.now();
    const summary = await model.summarize(doc.text, 3, call(`${doc.name}:summarize`));
    const tags = await model.tag(doc.text, 5, call(`${doc.name}:tag`));
    publish.run(doc.name, summary.value, JSON.stringify(tags.value));
    workMs.set(doc.name, performance.now() - t);
  }
  const seconds = (performance.now() - started) / 1000;
  db.close();
  return { row: loopRow('plain loop, no durability', [...workMs.values()], seconds), workMs };
}

async function checkpointLoop(
  docs: readonly Doc[],
  dir: string,
  synchronous: 'FULL' | 'NORMAL',
): Promise<Row> {
  const db = new Database(path.join(dir, `checkpoint-${synchronous}.db`));
  db.pragma('journal_mode = wal');
  db.pragma(`synchronous = ${synchronous}`);
  db.exec('CREATE TABLE checkpoints (doc TEXT, step TEXT, result TEXT, PRIMARY KEY (doc, step))');
  db.exec('CREATE TABLE publications (doc TEXT PRIMARY KEY, summary TEXT, tags TEXT)');
  const done = db.prepare('SELECT result FROM checkpoints WHERE doc = ? AND step = ?');
  const record = db.prepare('INSERT INTO checkpoints VALUES (?, ?, ?)');
  const publish = db.prepare('INSERT OR REPLACE INTO publications VALUES (?, ?, ?)');
  // The checkpoint's own cost per step, timed around its two statements: the difference of two loops' totals
  // is lost in the noise of the model work.
  const checkpointMs: number[] = [];
  const step = async <T>(doc: string, name: string, run: () => Promise<T>): Promise<T> => {
    let t = performance.now();
    const found = done.get(doc, name) as { result: string } | undefined;
    if (found !== undefined) return JSON.parse(found.result) as T;
    let spent = performance.now() - t;
    const result = await run();
    t = performance.now();
    record.run(doc, name, JSON.stringify(result));
    spent += performance.now() - t;
    checkpointMs.push(spent);
    return result;
  };
  const perDoc: number[] = [];
  const started = performance.now();
  for (const doc of docs) {
    const t = performance.now();
    const summary = await step(doc.name, 'summarize', () => model.summarize(doc.text, 3, call('s')));
    const tags = await step(doc.name, 'tag', () => model.tag(doc.text, 5, call('t')));
    await step(doc.name, 'publish', async () => {
      publish.run(doc.name, summary.value, JSON.stringify(tags.value));
      return true;
    });
    perDoc.push(performance.now() - t);
  }
  const seconds = (performance.now() - started) / 1000;
  db.close();
  return {
    ...loopRow(`SQLite checkpoint loop (synchronous=${synchronous})`, perDoc, seconds),
    perStepOverheadMsP50: round(percentile(checkpointMs, 50), 3),
    perStepOverheadMsP95: round(percentile(checkpointMs, 95), 3),
  };
}

function loopRow(name: string, perDoc: readonly number[], seconds: number): Row {
  return {
    path: name,
    concurrency: 1,
    docs: perDoc.length,
    msPerDocP50: round(percentile(perDoc, 50), 2),
    msPerDocP95: round(percentile(perDoc, 95), 2),
    docsPerSecond: round(perDoc.length / seconds),
  };
}

// ---------------------------------------------------------------------------------------------------------------
// This pipeline on a file-backed dev server
// ---------------------------------------------------------------------------------------------------------------

interface Server {
  env: TestWorkflowEnvironment;
  address: string;
  dir: string;
  pid: number | undefined;
}

async function startServer(root: string, label: string, tuned: boolean): Promise<Server> {
  const dir = fs.mkdtempSync(path.join(root, `${label}-`));
  const port = await freeLoopbackPort();
  const dbFilename = path.join(dir, 'temporal.db');
  const env = await TestWorkflowEnvironment.createLocal({
    server: {
      executable: { type: 'existing-path', path: await ensureTemporalExecutable('cli', loadConfig()) },
      ip: '127.0.0.1',
      port,
      dbFilename,
      log: { format: 'pretty', level: 'error' },
      extraArgs: tuned ? devServerArgs({ persistent: true }) : [],
    },
  });
  return { env, address: `127.0.0.1:${port}`, dir, pid: listenerOn(port)?.pid };
}

interface PipelineRun {
  rows: Row[];
  serverPeakMiB: number | undefined;
  coldStart?: { fromSourceMs: number; fromBundleMs: number };
  killToResumeMs?: number;
}

/** Runs the corpus through one server: the batch at each concurrency, optionally one by one with eager start. */
async function pipelineRuns(
  root: string,
  docs: readonly Doc[],
  workMs: Map<string, number>,
  options: { label: string; tuned: boolean; concurrencies: number[]; eager: boolean; extras: boolean },
): Promise<PipelineRun> {
  const server = await startServer(root, options.label, options.tuned);
  const rows: Row[] = [];
  const result: PipelineRun = { rows, serverPeakMiB: undefined };
  try {
    const config = loadConfig({ DATA_DIR: path.join(server.dir, 'data'), TEMPORAL_ADDRESS: server.address });
    const parts = await createDependencies(config);
    const taskQueue = `bench-${options.label}`;
    const bundle = prebuiltBundle() ?? {
      code: (await bundleWorkflowCode({ workflowsPath: require.resolve('../workflows'), logger: silent }))
        .code,
    };
    const worker = await createPipelineWorker({
      connection: server.env.nativeConnection,
      namespace: 'default',
      taskQueue,
      deps: parts.deps,
      workflowBundle: bundle,
    });
    // A client on the worker's own connection: the server may hand a started workflow's first task straight back
    // to this worker (eager start), skipping a round trip through the task queue.
    const client = new Client({ connection: server.env.nativeConnection, namespace: 'default' });
    await worker.runUntil(async () => {
      for (const concurrency of options.concurrencies) {
        rows.push(await runBatch(client, parts.stores.blobs, taskQueue, docs, workMs, options, concurrency));
      }
      if (options.eager) {
        rows.push(await runEagerOneByOne(client, parts.stores.blobs, taskQueue, docs, workMs, options.label));
      }
    });
    if (options.eager) {
      for (const concurrency of new Set([1, Math.max(...options.concurrencies)]))
        rows.push(await runEmptySteps(server, client, docs.length, concurrency));
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

const silent = { log() {}, trace() {}, debug() {}, info() {}, warn() {}, error() {} };

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
      const ms = (e: (typeof all)[number] | undefined): number => {
        const t = e?.eventTime;
        return t ? Number(t.seconds ?? 0) * 1000 + (t.nanos ?? 0) / 1e6 : 0;
      };
      const duration = ms(all[all.length - 1]) - ms(all[0]);
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

/** A row of documents run through Temporal: each one's time and its per-step overhead, and `seconds` for all. */
function timedRow(
  name: string,
  concurrency: number,
  perDoc: readonly number[],
  overhead: readonly number[],
  seconds: number,
): Row {
  return {
    path: name,
    concurrency,
    docs: perDoc.length,
    msPerDocP50: round(percentile(perDoc, 50)),
    msPerDocP95: round(percentile(perDoc, 95)),
    docsPerSecond: round(perDoc.length / seconds),
    perStepOverheadMsP50: round(percentile(overhead, 50)),
    perStepOverheadMsP95: round(percentile(overhead, 95)),
  };
}

/** One document at a time, each started eagerly by a client on the worker's connection, timed start to result. */
async function runEagerOneByOne(
  client: Client,
  blobs: { put(bytes: Uint8Array): Promise<string> },
  taskQueue: string,
  docs: readonly Doc[],
  workMs: Map<string, number>,
  label: string,
): Promise<Row> {
  const perDoc: number[] = [];
  const overhead: number[] = [];
  const started = performance.now();
  for (const doc of docs) {
    const t = performance.now();
    await client.workflow.execute(documentPipeline, {
      taskQueue,
      workflowId: workflowIdFor(`bench-${label}-eager:${doc.name}`),
      requestEagerStart: true,
      args: [
        {
          schemaVersion: INPUT_SCHEMA_VERSION,
          documentId: `bench-${label}-eager:${doc.name}`,
          textRef: await blobs.put(Buffer.from(doc.text)),
          title: doc.name,
          // Complete, as our clients send it: the workflow takes it as it is.
          options: PipelineOptionsSchema.parse({}),
        },
      ],
    });
    const duration = performance.now() - t;
    perDoc.push(duration);
    overhead.push((duration - (workMs.get(doc.name) ?? 0)) / STEPS_PER_DOCUMENT);
  }
  const seconds = (performance.now() - started) / 1000;
  return timedRow(
    'pipeline, one document at a time, eager start, tuned server',
    1,
    perDoc,
    overhead,
    seconds,
  );
}

/**
 * Temporal alone: `count` workflows of the pipeline's shape whose activities do nothing, `concurrency` at once,
 * each started eagerly as the eager row above: a document's time here is all overhead, the floor under the
 * pipeline's, and the docs/s at the largest concurrency is the ceiling over it on this machine.
 */
async function runEmptySteps(
  server: Server,
  client: Client,
  count: number,
  concurrency: number,
): Promise<Row> {
  const taskQueue = `bench-empty-steps-c${concurrency}`;
  const { code } = await bundleWorkflowCode({
    workflowsPath: require.resolve('./bench-workflows'),
    logger: silent,
  });
  const worker = await Worker.create({
    connection: server.env.nativeConnection,
    namespace: 'default',
    taskQueue,
    workflowBundle: { code },
    // The SDK's defaults for everything else, as the pipeline's worker (createPipelineWorker).
    activities: { nothing: async () => {} },
  });
  const perDoc: number[] = [];
  let next = 0;
  const started = performance.now();
  await worker.runUntil(() =>
    Promise.all(
      Array.from({ length: concurrency }, async () => {
        for (let i = next++; i < count; i = next++) {
          const t = performance.now();
          await client.workflow.execute(emptySteps, {
            taskQueue,
            workflowId: `bench-empty-steps-c${concurrency}-${i}`,
            requestEagerStart: true,
          });
          perDoc.push(performance.now() - t);
        }
      }),
    ),
  );
  const seconds = (performance.now() - started) / 1000;
  const perStep = perDoc.map((ms) => ms / STEPS_PER_DOCUMENT);
  const name = 'Temporal alone: the same three steps doing nothing, eager start';
  return timedRow(name, concurrency, perDoc, perStep, seconds);
}

/** Worker.create to polling: bundling the workflows from source, against loading the prebuilt bundle. */
async function coldStart(
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
    code: (await bundleWorkflowCode({ workflowsPath: require.resolve('../workflows'), logger: silent })).code,
  }));
  if (prebuiltBundle() === undefined) await runBuild();
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
async function killToResume(server: Server, dataDir: string): Promise<number | undefined> {
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

// ---------------------------------------------------------------------------------------------------------------
// Output: a markdown table, bench-results.json, bench-results.svg
// ---------------------------------------------------------------------------------------------------------------

function table(rows: readonly Row[], checkpointMs: number): string {
  const lines = [
    '| path | concurrency | ms per document p50 / p95 | per-step overhead ms p50 / p95 | vs checkpoint loop | docs/s | history events, bytes per document |',
    '|---|---|---|---|---|---|---|',
  ];
  for (const r of rows) {
    const overhead =
      r.perStepOverheadMsP50 !== undefined ? `${r.perStepOverheadMsP50} / ${r.perStepOverheadMsP95}` : '-';
    const ratio = `${round(r.msPerDocP50 / checkpointMs)}x`;
    const history =
      r.historyEventsPerDoc !== undefined ? `${r.historyEventsPerDoc}, ${r.historyBytesPerDoc}` : '-';
    lines.push(
      `| ${r.path} | ${r.concurrency} | ${r.msPerDocP50} / ${r.msPerDocP95} | ${overhead} | ${ratio} | ${r.docsPerSecond} | ${history} |`,
    );
  }
  return lines.join('\n');
}

/** Two bar charts side by side: documents per second, and per-step overhead where measured. */
function chart(rows: readonly Row[]): string {
  const width = 960;
  const barHeight = 22;
  const labelWidth = 420;
  const height = 60 + rows.length * (barHeight + 8) * 2 + 60;
  const escape = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;');
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="13">`,
    `<rect width="100%" height="100%" fill="white"/>`,
  ];
  const section = (
    title: string,
    top: number,
    value: (r: Row) => number | undefined,
    unit: string,
  ): number => {
    parts.push(`<text x="10" y="${top}" font-weight="bold" font-size="15">${escape(title)}</text>`);
    const max = Math.max(...rows.map((r) => value(r) ?? 0), 1);
    let y = top + 14;
    for (const r of rows) {
      const v = value(r);
      if (v === undefined) continue;
      const w = Math.max(1, ((width - labelWidth - 90) * v) / max);
      parts.push(
        `<text x="10" y="${y + 15}">${escape(`${r.path} (${r.concurrency})`)}</text>`,
        `<rect x="${labelWidth}" y="${y}" width="${w}" height="${barHeight}" fill="#3b6ea8"/>`,
        `<text x="${labelWidth + w + 6}" y="${y + 15}">${v} ${unit}</text>`,
      );
      y += barHeight + 8;
    }
    return y + 30;
  };
  const next = section('Documents per second (higher is better)', 30, (r) => r.docsPerSecond, 'docs/s');
  section('Per-step overhead, p50 (lower is better)', next, (r) => r.perStepOverheadMsP50, 'ms');
  parts.push('</svg>');
  return parts.join('\n');
}

async function run(): Promise<void> {
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const { where, docs } = loadCorpus();
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'pipeline-bench-'));
  console.log(
    `Corpus: ${where}, ${docs.length} documents. Machine: ${os.cpus().length} cores, Node ${process.version}.`,
  );
  let peakRss = 0;
  const sampler = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage().rss)), 100);
  try {
    // Warm the model (wink-nlp loads lazily), so the first loop does not pay for it.
    await model.summarize(docs[0]?.text ?? 'Warm up.', 3, call('warm'));
    const plain = await plainLoop(docs, root);
    const full = await checkpointLoop(docs, root, 'FULL');
    const normal = await checkpointLoop(docs, root, 'NORMAL');

    const rows: Row[] = [plain.row, full, normal];
    const runOn = async (
      label: string,
      tuned: boolean,
      concurrencies: number[],
      eager: boolean,
      extras: boolean,
    ) => {
      const result = await pipelineRuns(root, docs, plain.workMs, {
        label,
        tuned,
        concurrencies,
        eager,
        extras,
      });
      for (const r of result.rows)
        console.log(`  ${r.path}, ${r.concurrency} at once: ${r.docsPerSecond} docs/s`);
      rows.push(...result.rows);
      return result;
    };
    const untuned = await runOn('default', false, [1], false, false);
    const tuned = await runOn('tuned', true, QUICK ? [1, 16] : [1, 4, 16, 64], true, !QUICK);

    const checkpointMs = full.msPerDocP50;
    console.log('');
    console.log(table(rows, checkpointMs));
    const pipelineRows = rows.filter((r) => r.path.startsWith('pipeline'));
    const tunedAtOne = rows.find((r) => r.path.includes('batch workflow, tuned') && r.concurrency === 1);
    const best = Math.max(...pipelineRows.map((r) => r.docsPerSecond));
    const temporalAlone = rows.filter((r) => r.path.startsWith('Temporal alone'));
    const results = {
      measuredAt: new Date().toISOString(),
      machine: { cores: os.cpus().length, memoryGiB: round(os.totalmem() / 2 ** 30), node: process.version },
      corpus: { where, documents: docs.length },
      perStepOverheadMsP50: tunedAtOne?.perStepOverheadMsP50,
      perStepOverheadMsP95: tunedAtOne?.perStepOverheadMsP95,
      // Against the checkpoint table's own cost per step (synchronous=FULL, as durable as the pipeline).
      perStepOverheadRatioToCheckpointLoop:
        tunedAtOne?.perStepOverheadMsP50 !== undefined && full.perStepOverheadMsP50 !== undefined
          ? Math.round(tunedAtOne.perStepOverheadMsP50 / full.perStepOverheadMsP50)
          : undefined,
      // The floor: the same shape of workflow with activities that do nothing, on the same server.
      perStepMsP50TemporalAlone: temporalAlone.find((r) => r.concurrency === 1)?.perStepOverheadMsP50,
      // The ceiling: the most documents a second Temporal alone gets through here.
      docsPerSecondBestTemporalAlone: Math.max(...temporalAlone.map((r) => r.docsPerSecond)),
      docsPerSecondBest: best,
      checkpointLoopMsPerDoc: {
        full: full.msPerDocP50,
        normal: normal.msPerDocP50,
        plain: plain.row.msPerDocP50,
      },
      workerPeakMiB: round(peakRss / 2 ** 20),
      serverPeakMiB: { default: untuned.serverPeakMiB, tuned: tuned.serverPeakMiB },
      workerColdStartMs: tuned.coldStart,
      killToResumeMs: tuned.killToResumeMs,
      rows,
    };
    console.log('');
    console.log(
      `Per-step overhead p50 (tuned, 1 at a time): ${results.perStepOverheadMsP50} ms; best ${best} docs/s; ` +
        `worker peak ${results.workerPeakMiB} MiB; server peak ${tuned.serverPeakMiB ?? '?'} MiB (default ` +
        `${untuned.serverPeakMiB ?? '?'} MiB).`,
    );
    if (tuned.coldStart !== undefined) {
      console.log(
        `Worker cold start: ${tuned.coldStart.fromSourceMs} ms bundling from source, ${tuned.coldStart.fromBundleMs} ms from the prebuilt bundle.`,
      );
    }
    if (tuned.killToResumeMs !== undefined) {
      console.log(
        `SIGKILL of a worker mid-step to the step running on another worker: ${tuned.killToResumeMs} ms.`,
      );
    }
    fs.writeFileSync(path.join(ROOT, 'bench-results.json'), `${JSON.stringify(results, null, 2)}\n`);
    fs.writeFileSync(path.join(ROOT, 'bench-results.svg'), chart(rows));
    console.log('Wrote bench-results.json and bench-results.svg.');
  } finally {
    clearInterval(sampler);
    fs.rmSync(root, { recursive: true, force: true });
  }
}

runMain(run);
