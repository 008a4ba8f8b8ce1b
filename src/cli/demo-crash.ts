import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Client } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig, dataPaths, SAMPLES_DIR } from '../config';
import { FileBlobStore } from '../documents/blobs';
import { collectDocuments } from '../documents/files';
import { runMain } from '../lib/run-main';
import { SqliteAnswerMemo } from '../model/memo-sqlite';
import { SqlitePublicationStore } from '../publisher/publication-store';
import type { PublicationStore } from '../publisher/publication-store';
import { startReceiver } from '../publisher/receiver';
import { markSkippedOnResume, pendingSteps, recoveryReport, runDetails } from '../runs/history';
import type { StepReport } from '../runs/history';
import { classifyStep, summarizeReports } from '../runs/step-outcome';
import { followProgress, submitDocument } from '../runs/submit';
import type { Submission } from '../runs/submit';
import { describeExecutable, resolveTemporalExecutable } from '../temporal/binaries';
import { quietSdkLogs } from '../temporal/runtime';
import { startLink } from './demo/link';
import { demoModel, startModelServer } from './demo/model-server';
import type { ChatRequest, ModelServer } from './demo/model-server';
import { startWorkerProcess } from './demo/worker-process';
import type { WorkerProcess } from './demo/worker-process';

/** The demo's model server answers each call this long after it arrived, so the kill lands in the middle of some. */
const MODEL_LATENCY_MS = 1_500;
/** The model name the workers send; the demo's model server answers to any. */
const MODEL_NAME = 'demo-model';
/** Two processes' clocks on one machine: a model call this long after its step's recorded completion is a rerun. */
const CLOCK_TOLERANCE_MS = 500;
/** The publish target commits at once, but its answer takes this long to come back: a crash can fall in between. */
const PUBLISH_REPLY_DELAY_MS = 1_500;
/** Documents are submitted this far apart, so at the kill some are done, some mid-call, some not started. */
const SUBMIT_EVERY_MS = 900;

/** `<pid>@<host>` identities are shown as `pid <pid>`, with the worker's number in this demo. */
function processName(identity: string | undefined, workers: readonly WorkerProcess[]): string {
  if (identity === undefined) return '-';
  const index = workers.findIndex((w) => w.identity === identity);
  const pid = identity.split('@')[0] ?? identity;
  return index === -1 ? identity : `pid ${pid} (worker ${index + 1})`;
}

/**
 * `npm run demo:crash`: watch a crash and the recovery. Starts its own dev server, a slow model server, a publish
 * target and a real worker process, submits the shipped samples, SIGKILLs the worker while one document's
 * publication is committed but unacknowledged and other documents are mid model call, starts a new worker and
 * shows, per document, which steps ran in which process, which were skipped on resume and which were rerun; then
 * counts the model calls the model server received, per idempotency key, and the publications. Everything lives
 * in a temp folder and is removed at the end.
 */
async function run(): Promise<void> {
  const began = Date.now();
  const at = (ms = Date.now()): string => `+${((ms - began) / 1000).toFixed(1)} s`;
  quietSdkLogs();
  const config = loadConfig();
  const executable = resolveTemporalExecutable('cli', config);
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pipeline-crash-demo-'));
  const store = new SqlitePublicationStore(path.join(dataDir, 'publish-target', 'publications.db'));
  const cleanups: (() => Promise<void>)[] = [];
  const workers: WorkerProcess[] = [];
  try {
    console.log(`Starting a throwaway Temporal dev server (${describeExecutable(executable)})...`);
    const env = await TestWorkflowEnvironment.createLocal({
      server: { executable, ip: '127.0.0.1', log: { format: 'pretty', level: 'error' } },
    });
    cleanups.push(() => env.teardown());
    const receiver = await startReceiver(store);
    cleanups.push(() => receiver.close());
    const link = await startLink(receiver.url, { replyDelayMs: PUBLISH_REPLY_DELAY_MS });
    cleanups.push(() => link.close());
    const model = await startModelServer(demoModel(MODEL_LATENCY_MS));
    cleanups.push(() => model.close());
    const taskQueue = 'crash-demo';
    const workerEnv: NodeJS.ProcessEnv = {
      ...process.env,
      TEMPORAL_ADDRESS: env.address,
      TEMPORAL_NAMESPACE: 'default',
      TEMPORAL_TASK_QUEUE: taskQueue,
      DATA_DIR: dataDir,
      // The demo's own model server, whatever the shell says: the demo needs no account and no network, and it
      // counts every call the workers make.
      OPENAI_BASE_URL: model.baseUrl,
      OPENAI_MODEL: MODEL_NAME,
      OPENAI_API_KEY: '',
      MODEL_REQUEST_TIMEOUT_MS: '',
      PUBLISH_WEBHOOK_URL: link.url,
      // The demo's own stores in its throwaway folder, whatever the shell says: it counts the memo rows there.
      DATABASE_URL: '',
      // Plain payloads, whatever the shell says: the demo's client and its history reading use no codec.
      PAYLOAD_ENCRYPTION_KEY: '',
      PAYLOAD_ENCRYPTION_KEY_ID: '',
      PAYLOAD_DECRYPTION_KEYS: '',
      PAYLOAD_REQUIRE_ENCRYPTION: '',
      // The demo's local server, not a cluster from the shell's envconfig profile (no TLS, no API key).
      TEMPORAL_API_KEY: '',
      TEMPORAL_TLS: '',
      TEMPORAL_PROFILE: '',
      TEMPORAL_CONFIG_FILE: '',
    };
    console.log(
      `${at()} Server on ${env.address}; starting worker 1 (node src/worker.ts, which bundles the workflow)...`,
    );
    const first = await startWorkerProcess(workerEnv);
    workers.push(first);
    console.log(
      `${at()} Worker 1 is ${processName(first.identity, workers)}. The model server (${model.baseUrl}, model ` +
        `${MODEL_NAME}) answers each call ${MODEL_LATENCY_MS} ms after it arrives; the publish target commits at ` +
        `once and answers ${PUBLISH_REPLY_DELAY_MS} ms later.`,
    );

    const { documents } = collectDocuments([SAMPLES_DIR], config.maxDocumentBytes);
    const blobs = new FileBlobStore(dataPaths(dataDir).blobs);
    const client = env.client;
    const submissions: Submission[] = [];
    const submitting = (async () => {
      for (const document of documents) {
        const submission = await submitDocument(client, blobs, taskQueue, document);
        submissions.push(submission);
        console.log(`${at()} Submitted "${document.title}" as ${submission.workflowId}`);
        await sleep(SUBMIT_EVERY_MS);
      }
    })();

    const killed = await killWhenHalfway(client, submissions, store, model, first);
    console.log(
      `${at()} SIGKILL worker 1 (${first.identity}): ${killed.done} step(s) recorded as done; ` +
        `running at that moment: ${killed.running.join(', ') || 'nothing'}`,
    );
    console.log(
      `${at()} Starting worker 2. Temporal notices the dead worker's steps by their heartbeat timeout (10 s) and ` +
        'retries them under the same idempotency keys; finished steps are replayed from the history, not rerun.',
    );
    const second = await startWorkerProcess(workerEnv);
    workers.push(second);
    console.log(`${at()} Worker 2 is ${processName(second.identity, workers)}`);
    await submitting;

    await followProgress(submissions, (line) => console.log(`${at()} ${line.trim()}`));
    for (const s of submissions) await s.handle.result();
    console.log(`${at()} All ${submissions.length} documents are done.`);

    console.log('');
    console.log('Timeline (when each step was recorded as done, counted from the start of the demo):');
    const reports = [];
    const modelSteps: { title: string; step: StepReport }[] = [];
    for (const s of submissions) {
      const history = await s.handle.fetchHistory();
      const details = runDetails(history);
      const report = markSkippedOnResume(recoveryReport(history), details);
      reports.push(report);
      console.log(`  ${s.document.title} (${s.workflowId})`);
      for (const step of report.steps) {
        const how = explain(step, details.publication?.duplicate ?? false, first, workers);
        if (step.step !== 'publish') modelSteps.push({ title: s.document.title, step });
        const when = step.completedAt === undefined ? '-' : at(step.completedAt);
        console.log(
          `    ${when.padStart(8)}  ${step.step.padEnd(9)}  ${processName(step.worker, workers).padEnd(22)}  ${how}`,
        );
      }
    }

    const memo = new SqliteAnswerMemo(dataPaths(dataDir).memo);
    try {
      const revisions = (
        await Promise.all(submissions.map((s) => store.revisionsOf(s.document.documentId)))
      ).flat();
      const deliveries = await store.deliveries();
      const duplicates = deliveries.filter((d) => d.outcome === 'duplicate').length;
      const once = revisions.length === submissions.length && revisions.every((r) => r.revision === 1);
      console.log('');
      console.log(summarizeReports(reports));
      const calls = countModelCalls(model.requests, modelSteps, at);
      console.log(
        `Model calls, counted at the model server by their idempotency-key header: ${model.requests.length} ` +
          `call(s) under ${calls.keys} distinct key(s), for ${modelSteps.length} model steps.`,
      );
      if (calls.repeated.length === 0) console.log('  No key was called more than once.');
      else console.log(`  Called more than once: ${calls.repeated.length} key(s):`);
      for (const line of calls.repeated) console.log(`    ${line}`);
      console.log(
        `${calls.late.length} calls for steps already recorded as done: ` +
          (calls.late.length === 0
            ? 'no key was called after the history recorded its step as completed.'
            : `REPEATED FINISHED STEPS: ${calls.late.join('; ')}`),
      );
      for (const problem of calls.problems) console.log(`PROBLEM: ${problem}`);
      console.log(
        `Model answers kept (memo rows): ${await memo.count()} for ${modelSteps.length} model steps; a retry that ` +
          'finds its key there reads the answer back instead of calling the model again.',
      );
      if (calls.late.length > 0 || calls.problems.length > 0) process.exitCode = 1;
      console.log(
        `Publications: ${await store.countPublications()} document(s), ${revisions.length} revision(s): ` +
          `${once ? 'one per document, no duplicates' : 'MORE THAN ONE PER DOCUMENT'}. ` +
          `${deliveries.length} deliveries reached the target, ${duplicates} of them a retry answered with the ` +
          'first receipt.',
      );
      if (!once) process.exitCode = 1;
    } finally {
      await memo.close();
    }
    console.log(`Done in ${at().slice(1)}.`);
  } finally {
    for (const worker of workers) await worker.kill();
    for (const cleanup of cleanups.reverse()) await cleanup();
    await store.close();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
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
        '(expected: no answer had been received)'
      : 'an earlier call was answered but its worker died before it wrote the memo, so the answer was bought again';
    repeated.push(`${what} (${key}): ${own.length} calls (${fates.join(', ')}): ${why}`);
  }
  const stray = requests.filter((r) => !stepKeys.has(r.idempotencyKey ?? ''));
  if (stray.length > 0)
    problems.push(
      `${stray.length} call(s) under keys no step has: ${[...new Set(stray.map((r) => r.idempotencyKey))].join(', ')}`,
    );
  return { keys: new Set(requests.map((r) => r.idempotencyKey)).size, repeated, late, problems };
}

/**
 * Polls the runs until one document's publication is committed at the target but not yet acknowledged while
 * another document is mid model call, then SIGKILLs the worker: no shutdown, no goodbye to the server, as when a
 * machine dies. If that moment never comes, any moment with a model call running and a few steps done will do.
 */
async function killWhenHalfway(
  client: Client,
  submissions: readonly Submission[],
  store: PublicationStore,
  model: ModelServer,
  worker: WorkerProcess,
): Promise<{ done: number; running: string[] }> {
  const began = Date.now();
  while (Date.now() - began < 60_000) {
    let done = 0;
    let unacknowledged = false;
    const running: string[] = [];
    const published = new Set((await store.deliveries()).map((d) => d.documentId));
    for (const s of [...submissions]) {
      const handle = client.workflow.getHandle(s.workflowId);
      const report = recoveryReport(await handle.fetchHistory());
      done += report.steps.filter((step) => step.status === 'completed').length;
      const started = pendingSteps((await handle.describe()).raw.pendingActivities).filter(
        (p) => p.state === 'started',
      );
      for (const p of started) {
        const committed = p.step === 'publish' && published.has(s.document.documentId);
        if (committed) unacknowledged = true;
        running.push(
          `"${s.document.title}" ${p.step}${committed ? ' (committed, not yet acknowledged)' : ''}`,
        );
      }
    }
    const modelCallRunning = model.open().length > 0;
    const fallback = Date.now() - began > 20_000 && done >= 3;
    if (modelCallRunning && (unacknowledged || fallback)) {
      await worker.kill();
      return { done, running };
    }
    await sleep(50);
  }
  throw new Error('the runs never reached the kill point: is the worker processing them?');
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
