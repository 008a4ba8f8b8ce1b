import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadConfig, dataPaths, SAMPLES_DIR } from '../config';
import type { PipelineResult } from '../contract';
import { FileBlobStore } from '../documents/blobs';
import { collectDocuments } from '../documents/files';
import { runMain } from '../lib/run-main';
import { SqliteAnswerMemo } from '../model/memo-store';
import { SqlitePublicationStore } from '../publisher/publication-store';
import { startReceiver } from '../publisher/receiver';
import { markSkippedOnResume, recoveryReport, runDetails } from '../runs/history';
import type { StepReport } from '../runs/history';
import { classifyStep, summarizeReports } from '../runs/step-outcome';
import { submitDocument } from '../runs/submit';
import type { Submission } from '../runs/submit';
import { connectClient } from '../temporal/connection';
import { startEmbeddedServer } from '../temporal/dev-server';
import { freeLoopbackPort } from '../lib/loopback';
import { startLink } from './demo/link';
import { demoModel, startModelServer } from './demo/model-server';
import type { ChatRequest } from './demo/model-server';
import { startWorkerProcess } from './demo/worker-process';
import type { WorkerProcess } from './demo/worker-process';

/** The demo's model server answers each call this long after it arrived. */
const MODEL_LATENCY_MS = 1_000;
/** The model name the workers send; the demo's model server answers to any. */
const MODEL_NAME = 'demo-model';
/** Two processes' clocks on one machine: a model call this long after its step's recorded completion is a rerun. */
const CLOCK_TOLERANCE_MS = 500;
/** With --manual, how long the demo waits for you to kill worker 1 before it does so itself. */
const MANUAL_WINDOW_S = 45;

/**
 * `npm run demo:crash [-- --manual]`: watch a crash and the recovery. Starts its own dev server, a model server, a
 * publish target and a real worker process, and submits the shipped samples. The crash is set up the same way every
 * time: the first document is published, but the publish target's answer is held back from worker 1; the other
 * documents have their summary and wait inside their tag call. Then worker 1 is SIGKILLed (with --manual, by you,
 * from another terminal), a new worker starts, and the demo shows per document which steps were replayed from the
 * history and which were rerun, counts the model calls the model server received per idempotency key, and the
 * publications. Everything lives in a temp folder and is removed at the end.
 */
async function run(): Promise<void> {
  const manual = process.argv.slice(2).includes('--manual');
  const began = Date.now();
  const at = (ms = Date.now()): string => `+${((ms - began) / 1000).toFixed(1)} s`;
  const config = loadConfig();
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pipeline-crash-demo-'));
  // The demo's own server on free ports with its database in the throwaway folder: the project's embedded server.
  const serverConfig = loadConfig({
    ...process.env,
    TEMPORAL_ADDRESS: '',
    DATA_DIR: dataDir,
    EMBEDDED_TEMPORAL_PORT: String(await freeLoopbackPort()),
    TEMPORAL_UI_PORT: String(await freeLoopbackPort()),
    PAYLOAD_ENCRYPTION_KEY: '',
    PAYLOAD_DECRYPTION_KEYS: '',
    PAYLOAD_REQUIRE_ENCRYPTION: '',
  });
  const store = new SqlitePublicationStore(path.join(dataDir, 'publish-target', 'publications.db'));
  const cleanups: (() => Promise<void>)[] = [];
  const workers: WorkerProcess[] = [];
  try {
    say('Starting a throwaway Temporal dev server, a model server, a publish target and worker 1...');
    const server = await startEmbeddedServer(serverConfig);
    cleanups.push(() => server.stop());
    const address = `127.0.0.1:${serverConfig.embeddedPort}`;
    const { client, close } = await connectClient(serverConfig, {
      endpoint: { address, namespace: 'default', secure: {} },
    });
    cleanups.push(close);
    const { documents } = collectDocuments([SAMPLES_DIR], config.maxDocumentBytes);
    documents.sort((a, b) => a.source.localeCompare(b.source));
    const [firstDocument] = documents;
    if (firstDocument === undefined) throw new Error(`no documents in ${SAMPLES_DIR}`);
    const runs: Submission[] = [];
    let crashed = false;
    const firstRun = (key: string | undefined): boolean =>
      runs[0] !== undefined && key?.startsWith(`${runs[0].runId}:`) === true;

    const receiver = await startReceiver(store);
    cleanups.push(() => receiver.close());
    // The first document's publication is committed at the target, but worker 1 never hears back.
    const link = await startLink(receiver.url, { holdReply: (request) => !crashed && firstRun(request.key) });
    cleanups.push(() => link.close());
    // The other documents' tag calls are held open until worker 1 is gone: the crash cuts them off.
    const answer = demoModel(MODEL_LATENCY_MS);
    const model = await startModelServer((request, n) =>
      request.step === 'tag' && !crashed && !firstRun(request.idempotencyKey) ? 'hang' : answer(request, n),
    );
    cleanups.push(() => model.close());
    const taskQueue = 'crash-demo';
    const workerEnv: NodeJS.ProcessEnv = {
      ...process.env,
      TEMPORAL_ADDRESS: address,
      TEMPORAL_NAMESPACE: 'default',
      TEMPORAL_TASK_QUEUE: taskQueue,
      DATA_DIR: dataDir,
      // The demo's own model server, whatever the shell says: the demo needs no account and no network, and it
      // counts every call the workers make.
      OPENAI_BASE_URL: model.baseUrl,
      OPENAI_MODEL: MODEL_NAME,
      // Whatever the shell sets: the demo's model is the stand-in above.
      MODEL: '',
      OPENAI_API_KEY: '',
      MODEL_REQUEST_TIMEOUT_MS: '',
      PUBLISH_WEBHOOK_URL: link.url,
      // Longer than the kill window: worker 1 keeps waiting for the held answer until it is killed.
      PUBLISH_REQUEST_TIMEOUT_MS: String((MANUAL_WINDOW_S + 10) * 1000),
      PUBLISH_WEBHOOK_SECRET: '',
      // The publish target dedupes by Idempotency-Key: a retry after the crash may send again.
      OPEN_DELIVERY_POLICY: 'resend',
      // A dead worker's claim on its model answer lapses soon, so the retry does not wait long to take it over.
      MEMO_LEASE_SECONDS: '5',
      // The demo's own stores in its throwaway folder, whatever the shell says: it counts the memo rows there.
      DATABASE_URL: '',
      // Plain payloads, whatever the shell says: the demo's client and its history reading use no codec.
      PAYLOAD_ENCRYPTION_KEY: '',
      PAYLOAD_ENCRYPTION_KEY_ID: '',
      PAYLOAD_DECRYPTION_KEYS: '',
      PAYLOAD_REQUIRE_ENCRYPTION: '',
      DOCUMENT_ID_SECRET: '',
      // The demo's local server, not a cluster from the shell's envconfig profile (no TLS, no API key).
      TEMPORAL_API_KEY: '',
      TEMPORAL_TLS: '',
      TEMPORAL_PROFILE: '',
      TEMPORAL_CONFIG_FILE: '',
    };
    const first = await startWorkerProcess(workerEnv);
    workers.push(first);
    say(
      `${at()} Worker 1 is pid ${first.child.pid}. The model answers each call after ${MODEL_LATENCY_MS / 1000} s, ` +
        `but holds the tag calls of documents 2 to ${documents.length} until worker 1 is gone; the publish ` +
        'target commits at once, but never answers worker 1.',
    );

    const blobs = new FileBlobStore(dataPaths(dataDir).blobs);
    for (const document of documents) {
      const submission = await submitDocument(client, blobs, taskQueue, document);
      runs.push(submission);
      say(`${at()} Submitted "${document.title}" as ${submission.workflowId}`);
    }

    const done = await readyForCrash(runs, store, model);
    say(
      `${at()} Ready: "${firstDocument.title}" is published, but worker 1 has not heard back; ` +
        `${runs.length - 1} documents wait inside their tag call; ${done} steps are recorded as done.`,
    );
    const pid = first.child.pid ?? 0;
    if (manual) {
      say(`Kill worker 1 as a crash would, from another terminal:  kill -9 ${pid}`);
      say(`(or press Enter here; after ${MANUAL_WINDOW_S} s the demo sends it itself)`);
      await waitForKill(first, MANUAL_WINDOW_S * 1000);
    } else {
      await first.kill();
    }
    const how = await first.exited;
    crashed = true;
    say(
      `${at()} Worker 1 is gone (${how}). Starting worker 2: Temporal retries the dead worker's steps once their ` +
        'heartbeat timeout (10 s) has passed, under the same idempotency keys; finished steps are replayed from ' +
        'the history, not run again.',
    );
    const second = await startWorkerProcess(workerEnv);
    workers.push(second);
    say(`${at()} Worker 2 is pid ${second.child.pid}.`);

    for (const r of runs) {
      const result: PipelineResult = await r.handle.result();
      const receipt = result.publication.duplicate ? ', a retry answered with the first receipt' : '';
      say(
        `${at()} "${r.document.title}" done: published as revision ${result.publication.revision}${receipt}`,
      );
    }

    say('');
    say('Timeline (when each step was recorded as done, counted from the start of the demo):');
    const reports = [];
    const modelSteps: { title: string; step: StepReport }[] = [];
    for (const r of runs) {
      const history = await r.handle.fetchHistory();
      const details = runDetails(history);
      const report = markSkippedOnResume(recoveryReport(history), details);
      reports.push(report);
      say(`  ${r.document.title} (${r.workflowId})`);
      for (const step of report.steps) {
        const how = explain(step, details.publication?.duplicate ?? false, first, workers);
        if (step.step !== 'publish') modelSteps.push({ title: r.document.title, step });
        const when = step.completedAt === undefined ? '-' : at(step.completedAt);
        const by = processName(step.worker, workers);
        say(`  ${when.padStart(8)}  ${step.step.padEnd(9)}  ${by.padEnd(8)}  ${how}`, ' '.repeat(33));
      }
    }

    const memo = new SqliteAnswerMemo(dataPaths(dataDir).memo);
    try {
      const revisions = (await Promise.all(runs.map((r) => store.revisionsOf(r.document.documentId)))).flat();
      const deliveries = await store.deliveries();
      const duplicates = deliveries.filter((d) => d.outcome === 'duplicate').length;
      const once = revisions.length === runs.length && revisions.every((r) => r.revision === 1);
      say('');
      say(summarizeReports(reports));
      const calls = countModelCalls(model.requests, modelSteps, at);
      say(
        `Model calls, counted at the model server by their idempotency-key header: ${model.requests.length} ` +
          `call(s) under ${calls.keys} distinct key(s), for ${modelSteps.length} model steps.`,
      );
      if (calls.repeated.length === 0) say('  No key was called more than once.');
      else say(`  Called more than once: ${calls.repeated.length} key(s):`);
      for (const line of calls.repeated) say(`    ${line}`, '      ');
      say(
        `${calls.late.length} calls for steps already recorded as done: ` +
          (calls.late.length === 0
            ? 'no key was called after the history recorded its step as completed.'
            : `REPEATED FINISHED STEPS: ${calls.late.join('; ')}`),
      );
      for (const problem of calls.problems) say(`PROBLEM: ${problem}`);
      say(
        `Model answers kept (memo rows): ${await memo.count()} for ${modelSteps.length} model steps; a retry that ` +
          'finds its key there reads the answer back instead of calling the model again.',
      );
      if (calls.late.length > 0 || calls.problems.length > 0) process.exitCode = 1;
      say(
        `Publications: ${await store.countPublications()} document(s), ${revisions.length} revision(s): ` +
          `${once ? 'one per document, no duplicates' : 'MORE THAN ONE PER DOCUMENT'}. ` +
          `${deliveries.length} deliveries reached the target, ${duplicates} of them a retry answered with the ` +
          'first receipt.',
      );
      if (!once) process.exitCode = 1;
    } finally {
      await memo.close();
    }
    say(`Done in ${at().slice(1)}.`);
  } finally {
    for (const worker of workers) await worker.kill();
    for (const cleanup of cleanups.reverse()) await cleanup();
    await store.close();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}

/** The demo's output width: lines are wrapped at spaces, continuation lines indented by `indent`. */
const WIDTH = 110;

/** Prints `text` wrapped to WIDTH columns. */
function say(text: string, indent = text.startsWith('+') ? ' '.repeat(text.indexOf(' s ') + 3) : '  '): void {
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(/(?<= )/)) {
    if (line.length + word.trimEnd().length > WIDTH && line.trim() !== '') {
      lines.push(line.trimEnd());
      line = indent;
    }
    line += word;
  }
  lines.push(line.trimEnd());
  console.log(lines.join('\n'));
}

/** `<pid>@<host>` identities are shown as the worker's number in this demo (their pids are printed as they start). */
function processName(identity: string | undefined, workers: readonly WorkerProcess[]): string {
  if (identity === undefined) return '-';
  const index = workers.findIndex((w) => w.identity === identity);
  const pid = identity.split('@')[0] ?? identity;
  return index === -1 ? `pid ${pid}` : `worker ${index + 1}`;
}

/**
 * Waits until the crash is set up: the first document's publication committed at the target (its answer held),
 * every other document's summary recorded and its tag call open at the model server. Returns the steps done.
 */
async function readyForCrash(
  runs: readonly Submission[],
  store: SqlitePublicationStore,
  model: { open(): ChatRequest[] },
): Promise<number> {
  const deadline = Date.now() + 60_000;
  const [first, ...others] = runs;
  while (Date.now() < deadline) {
    const published = new Set((await store.deliveries()).map((d) => d.documentId));
    const openTags = new Set(model.open().flatMap((r) => (r.step === 'tag' ? [r.idempotencyKey] : [])));
    let done = 0;
    let summarized = 0;
    for (const r of runs) {
      const report = recoveryReport(await r.handle.fetchHistory(), 0, r.runId);
      done += report.steps.filter((s) => s.status === 'completed').length;
      if (report.steps.some((s) => s.step === 'summarize' && s.status === 'completed')) summarized += 1;
    }
    const tagsOpen = others.every((r) => openTags.has(`${r.runId}:tag`));
    if (
      first !== undefined &&
      published.has(first.document.documentId) &&
      tagsOpen &&
      summarized === runs.length
    )
      return done;
    await sleep(100);
  }
  throw new Error('the runs never reached the crash point: is worker 1 processing them?');
}

/** Until worker 1 is gone: killed by you, or by the demo when you press Enter or the window has passed. */
async function waitForKill(worker: WorkerProcess, windowMs: number): Promise<void> {
  const stdin = process.stdin;
  const enter = new Promise<void>((resolve) => {
    if (!stdin.isTTY) return;
    stdin.once('data', () => resolve());
  });
  const timeout = sleep(windowMs, undefined, { ref: false });
  await Promise.race([worker.exited, enter, timeout]);
  if (stdin.isTTY) stdin.pause();
  await worker.kill();
}

/**
 * The model server's request log checked against the histories, as the chaos test does: per key, how many calls
 * and why more than one; any call that arrived after its step's completion was recorded (a finished step run
 * again), and calls that do not fit the history at all.
 */
function countModelCalls(
  requests: readonly ChatRequest[],
  modelSteps: readonly { title: string; step: StepReport }[],
  at: (ms?: number) => string,
): { keys: number; repeated: string[]; late: string[]; problems: string[] } {
  const repeated: string[] = [];
  const late: string[] = [];
  const problems: string[] = [];
  const stepKeys = new Set<string>();
  for (const { title, step } of modelSteps) {
    const key = step.idempotencyKey;
    const what = `"${title}" ${step.step}`;
    if (key === undefined || step.status !== 'completed' || step.completedAt === undefined) {
      problems.push(`${what} is ${step.status}, not completed`);
      continue;
    }
    stepKeys.add(key);
    const own = requests.filter((r) => r.idempotencyKey === key);
    const after = own.filter((r) => r.receivedAt > (step.completedAt ?? 0) + CLOCK_TOLERANCE_MS);
    if (after.length > 0)
      late.push(`${what} (${key}): ${after.length} call(s) after ${at(step.completedAt)}`);
    if (own.length === 0) problems.push(`${what} (${key}) never reached the model server`);
    if (own.length > step.attempts)
      problems.push(`${what} (${key}): ${own.length} calls for ${step.attempts} recorded attempt(s)`);
    if (own.length < 2) continue;
    const fates = own.map(
      (r) =>
        `${at(r.receivedAt)} ${r.cutOff ? 'cut off by the kill' : r.answeredAt !== undefined ? 'answered' : 'open'}`,
    );
    const earlier = own.slice(0, -1);
    const why = earlier.every((r) => r.cutOff)
      ? 'the kill cut off the call before its answer came back, so the retry asked again under the same key ' +
        '(expected: no answer had been paid for)'
      : 'an earlier call was answered but its worker died before it wrote the memo, so the answer was bought again';
    repeated.push(`${what}: ${own.length} calls (${fates.join(', ')}): ${why}`);
  }
  const stray = requests.filter((r) => !stepKeys.has(r.idempotencyKey ?? ''));
  if (stray.length > 0)
    problems.push(
      `${stray.length} call(s) under keys no step has: ${[...new Set(stray.map((r) => r.idempotencyKey))].join(', ')}`,
    );
  return { keys: new Set(requests.map((r) => r.idempotencyKey)).size, repeated, late, problems };
}

/** How one step fared, for the timeline. */
function explain(
  step: StepReport,
  duplicatePublish: boolean,
  killed: WorkerProcess,
  workers: readonly WorkerProcess[],
): string {
  const outcome = classifyStep(step);
  if (outcome === 'skipped on resume')
    return 'done before the crash; skipped on resume (replayed from the history)';
  if (outcome === 'memoised')
    return `attempt ${step.attempts}: reused the answer memoised before the crash, no second model call`;
  if (outcome === 'rerun') {
    const lost = `${(step.timeLostMs / 1000).toFixed(1)} s lost`;
    const why = `${step.lastFailure ?? 'no failure recorded'} after ${processName(killed.identity, workers)} died`;
    const receipt =
      step.step === 'publish' && duplicatePublish
        ? '; the target had committed the killed attempt and answered this one with its first receipt'
        : '';
    return `rerun as attempt ${step.attempts} (${why}; ${lost})${receipt}`;
  }
  if (outcome !== 'once') return outcome;
  if (step.worker === killed.identity) return 'ran once, before the crash';
  return 'ran once, after the crash';
}

runMain(run);
