import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Client } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { SAMPLES_DIR } from './batch';
import { describeExecutable, resolveTemporalExecutable } from './binaries';
import { BlobStore } from './blobs';
import { followProgress, submitDocument } from './client';
import type { Submission } from './client';
import { loadConfig } from './config';
import { dataPaths } from './dependencies';
import { collectDocuments } from './documents';
import { AnswerMemo } from './model/memo';
import { PublicationStore } from './publisher/publication-store';
import { startReceiver } from './publisher/receiver';
import { markSkippedOnResume, pendingSteps, recoveryReport, runDetails } from './report';
import type { StepReport } from './report';
import { quietSdkLogs, runMain } from './run-main';

const ROOT = path.resolve(__dirname, '..');
/** Each offline "model call" takes this long, so the kill lands in the middle of some of them. */
const MODEL_LATENCY_MS = 1_500;
/** The publish target commits at once, but its answer takes this long to come back: a crash can fall in between. */
const PUBLISH_REPLY_DELAY_MS = 1_500;
/** Documents are submitted this far apart, so at the kill some are done, some mid-call, some not started. */
const SUBMIT_EVERY_MS = 900;

interface DemoWorker {
  child: ChildProcess;
  identity: string;
  exited: Promise<void>;
}

/** Runs `src/worker.ts` (the real `npm run worker`) as a child process and waits until it polls. */
function startWorker(env: NodeJS.ProcessEnv): Promise<DemoWorker> {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(__dirname, 'worker.ts')], {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the worker did not start within 2 minutes:\n${output}`));
    }, 120_000);
    const collect = (chunk: Buffer): void => {
      output += chunk.toString('utf8');
      const ready = /^Worker (\S+) polling/m.exec(output);
      if (ready?.[1] !== undefined) {
        clearTimeout(timer);
        resolve({ child, identity: ready[1], exited });
      }
    };
    child.stdout?.on('data', collect);
    child.stderr?.on('data', collect);
    void exited.then(() => {
      clearTimeout(timer);
      reject(new Error(`the worker exited before it was ready:\n${output}`));
    });
  });
}

/** `<pid>@<host>` identities are shown as `pid <pid>`, with the worker's number in this demo. */
function processName(identity: string | undefined, workers: readonly DemoWorker[]): string {
  if (identity === undefined) return '-';
  const index = workers.findIndex((w) => w.identity === identity);
  const pid = identity.split('@')[0] ?? identity;
  return index === -1 ? identity : `pid ${pid} (worker ${index + 1})`;
}

/**
 * The publish target as a worker sees it from far away: the real receiver (src/publisher/receiver.ts) commits the
 * publication at once, but its answer travels back slowly. A worker that dies in between has published without
 * knowing it; its retry, under the same key, must get the first receipt rather than publish again.
 */
async function startSlowLink(
  targetUrl: string,
  delayMs: number,
): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const key = req.headers['idempotency-key'];
      const forward = async (): Promise<void> => {
        const answer = await fetch(targetUrl, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            ...(typeof key === 'string' ? { 'idempotency-key': key } : {}),
          },
          body: Buffer.concat(chunks),
        });
        const body = await answer.text();
        await sleep(delayMs);
        if (res.destroyed) return;
        res.writeHead(answer.status, { 'content-type': 'application/json' });
        res.end(body);
      };
      forward().catch((err: unknown) => {
        if (res.destroyed) return;
        res.writeHead(502, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: String(err) }));
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('the slow link did not bind a port');
  return {
    url: `http://127.0.0.1:${address.port}/publications`,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * `npm run demo:crash`: watch a crash and the recovery. Starts its own dev server, a publish target and a real
 * worker process, submits the shipped samples, SIGKILLs the worker while one document's publication is committed
 * but unacknowledged and other documents are mid model call, starts a new worker and shows, per document, which
 * steps ran in which process, which were skipped on resume and which were rerun; then counts the paid model
 * answers and the publications. Everything lives in a temp folder and is removed at the end.
 */
async function run(): Promise<void> {
  const began = Date.now();
  const at = (ms = Date.now()): string => `+${((ms - began) / 1000).toFixed(1)} s`;
  quietSdkLogs();
  const config = loadConfig();
  const executable = resolveTemporalExecutable('cli', config.cliPath);
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pipeline-crash-demo-'));
  const store = new PublicationStore(path.join(dataDir, 'publish-target', 'publications.db'));
  const cleanups: (() => Promise<void>)[] = [];
  const workers: DemoWorker[] = [];
  try {
    console.log(`Starting a throwaway Temporal dev server (${describeExecutable(executable)})...`);
    const env = await TestWorkflowEnvironment.createLocal({
      server: { executable, ip: '127.0.0.1', log: { format: 'pretty', level: 'error' } },
    });
    cleanups.push(() => env.teardown());
    const receiver = await startReceiver(store);
    cleanups.push(() => receiver.close());
    const link = await startSlowLink(receiver.url, PUBLISH_REPLY_DELAY_MS);
    cleanups.push(() => link.close());
    const taskQueue = 'crash-demo';
    const workerEnv: NodeJS.ProcessEnv = {
      ...process.env,
      TEMPORAL_ADDRESS: env.address,
      TEMPORAL_NAMESPACE: 'default',
      TEMPORAL_TASK_QUEUE: taskQueue,
      DATA_DIR: dataDir,
      // The offline model, slowed down, whatever the shell says: the demo needs no account and no network.
      OFFLINE_MODEL_LATENCY_MS: String(MODEL_LATENCY_MS),
      OPENAI_BASE_URL: '',
      OPENAI_MODEL: '',
      OPENAI_API_KEY: '',
      PUBLISH_WEBHOOK_URL: link.url,
    };
    console.log(
      `${at()} Server on ${env.address}; starting worker 1 (node src/worker.ts, which bundles the workflow)...`,
    );
    const first = await startWorker(workerEnv);
    workers.push(first);
    console.log(
      `${at()} Worker 1 is ${processName(first.identity, workers)}. Each model call takes ${MODEL_LATENCY_MS} ms; ` +
        `the publish target commits at once and answers ${PUBLISH_REPLY_DELAY_MS} ms later.`,
    );

    const { documents } = collectDocuments([SAMPLES_DIR], config.maxDocumentBytes);
    const blobs = new BlobStore(dataPaths(dataDir).blobs);
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

    const killed = await killWhenHalfway(client, submissions, store, first);
    console.log(
      `${at()} SIGKILL worker 1 (${first.identity}): ${killed.done} step(s) recorded as done; ` +
        `running at that moment: ${killed.running.join(', ') || 'nothing'}`,
    );
    console.log(
      `${at()} Starting worker 2. Temporal notices the dead worker's steps by their heartbeat timeout (10 s) and ` +
        'retries them under the same idempotency keys; finished steps are replayed from the history, not rerun.',
    );
    const second = await startWorker(workerEnv);
    workers.push(second);
    console.log(`${at()} Worker 2 is ${processName(second.identity, workers)}`);
    await submitting;

    await followProgress(submissions, (line) => console.log(`${at()} ${line.trim()}`));
    for (const s of submissions) await s.handle.result();
    console.log(`${at()} All ${submissions.length} documents are done.`);

    console.log('');
    console.log('Timeline (when each step was recorded as done, counted from the start of the demo):');
    const totals = { skipped: 0, rerun: 0, memo: 0 };
    for (const s of submissions) {
      const history = await s.handle.fetchHistory();
      const details = runDetails(history);
      const report = markSkippedOnResume(recoveryReport(history), details);
      console.log(`  ${s.document.title} (${s.workflowId})`);
      for (const step of report.steps) {
        const how = explain(step, details.publication?.duplicate ?? false, first, workers);
        if (step.skippedOnResume) totals.skipped += 1;
        if (step.attempts > 1 && !step.memoised) totals.rerun += 1;
        if (step.memoised) totals.memo += 1;
        const when = step.completedAt === undefined ? '-' : at(step.completedAt);
        console.log(
          `    ${when.padStart(8)}  ${step.step.padEnd(9)}  ${processName(step.worker, workers).padEnd(22)}  ${how}`,
        );
      }
    }

    const memo = new AnswerMemo(dataPaths(dataDir).memo);
    try {
      const revisions = submissions.flatMap((s) => store.revisionsOf(s.document.documentId));
      const deliveries = store.deliveries();
      const duplicates = deliveries.filter((d) => d.outcome === 'duplicate').length;
      const once = revisions.length === submissions.length && revisions.every((r) => r.revision === 1);
      console.log('');
      console.log(
        `Recovery: ${totals.skipped} step(s) skipped on resume, ${totals.rerun} rerun after the crash, ` +
          `${totals.memo} model answer(s) reused from the memo.`,
      );
      console.log(
        `Model answers paid for (memo rows): ${memo.count()} for ${submissions.length * 2} model steps. A call cut ` +
          'off by the kill produced no answer; one received before it would be read back, not bought again.',
      );
      console.log(
        `Publications: ${store.countPublications()} document(s), ${revisions.length} revision(s): ` +
          `${once ? 'one per document, no duplicates' : 'MORE THAN ONE PER DOCUMENT'}. ` +
          `${deliveries.length} deliveries reached the target, ${duplicates} of them a retry answered with the ` +
          'first receipt.',
      );
      if (!once) process.exitCode = 1;
    } finally {
      memo.close();
    }
    console.log(`Done in ${at().slice(1)}.`);
  } finally {
    for (const worker of workers) {
      if (worker.child.exitCode === null && worker.child.signalCode === null) {
        worker.child.kill('SIGKILL');
        await worker.exited;
      }
    }
    for (const cleanup of cleanups.reverse()) await cleanup();
    store.close();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
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
  worker: DemoWorker,
): Promise<{ done: number; running: string[] }> {
  const began = Date.now();
  while (Date.now() - began < 60_000) {
    let done = 0;
    let unacknowledged = false;
    const running: string[] = [];
    const published = new Set(store.deliveries().map((d) => d.documentId));
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
    const modelCallRunning = running.some((r) => !r.includes(' publish'));
    const fallback = Date.now() - began > 20_000 && done >= 3;
    if (modelCallRunning && (unacknowledged || fallback)) {
      worker.child.kill('SIGKILL');
      await worker.exited;
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
  killed: DemoWorker,
  workers: readonly DemoWorker[],
): string {
  if (step.status !== 'completed') return step.status;
  if (step.skippedOnResume) return 'done before the crash; skipped on resume (replayed from the history)';
  if (step.memoised)
    return `attempt ${step.attempts}: reused the answer memoised before the crash, no second model call`;
  if (step.attempts > 1) {
    const lost = `${(step.timeLostMs / 1000).toFixed(1)} s lost`;
    const why = `${step.lastFailure ?? 'no failure recorded'} after ${processName(killed.identity, workers)} died`;
    const receipt =
      step.step === 'publish' && duplicatePublish
        ? '; the target had committed the killed attempt and answered this one with its first receipt'
        : '';
    return `rerun as attempt ${step.attempts} (${why}; ${lost})${receipt}`;
  }
  if (step.worker === killed.identity) return 'ran once, before the crash';
  return 'ran once, after the crash';
}

runMain(run);
