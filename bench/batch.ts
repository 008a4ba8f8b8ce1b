/**
 * `npm run bench:batch [-- --docs 10000]`: one big batch, end to end, as a person runs it. A tuned, file-backed
 * dev server; `npm run worker` and `npm run pipeline <folder>` as separate processes; the worker SIGKILLed when the
 * batch is about 40% through and another started. Then it checks what the batch promises and prints figures:
 *
 * - every document published exactly once (revision 1, no second revision, none missing);
 * - every run of the batch workflow below 10,240 history events (it continues as new before that);
 * - the client's peak memory, against a batch a tenth the size: flat, not growing with the batch.
 *
 * A benchmark, not a test: it takes minutes (10,000 documents at ~20-30/s on 2 cores). `--docs` sets the size.
 */
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { loadConfig } from '../src/config';
import { runMain } from '../src/lib/run-main';
import { writeDocuments } from './lib/documents';
import { peakMiB } from './lib/memory';
import { startLocalDevServer } from '../src/temporal/local-server';

const ROOT = path.resolve(__dirname, '..');
const HISTORY_LIMIT = 10_240;

function arg(name: string, fallback: number): number {
  const at = process.argv.indexOf(name);
  const value = at === -1 ? undefined : Number(process.argv[at + 1]);
  return value !== undefined && Number.isInteger(value) && value > 0 ? value : fallback;
}

function tsx(script: string, env: NodeJS.ProcessEnv, args: string[] = []): ChildProcess {
  return spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, script), ...args], {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

interface ClientRun {
  exitCode: number | null;
  seconds: number;
  peakMiB: number;
  output: string;
}

/**
 * `npm run pipeline <dir>` to its end, sampling its peak memory; `onProgress` sees each progress line (the client
 * prints one per tenth of the batch when its output is not a terminal).
 */
async function runClient(
  env: NodeJS.ProcessEnv,
  dir: string,
  onProgress?: (ended: number) => void,
): Promise<ClientRun> {
  const started = Date.now();
  const client = tsx('src/cli/pipeline.ts', env, [dir]);
  let output = '';
  let peak = 0;
  const sampler = setInterval(() => (peak = Math.max(peak, peakMiB(client.pid ?? 0) ?? 0)), 200);
  const read = (chunk: Buffer): void => {
    const text = chunk.toString('utf8');
    output += text;
    for (const match of text.matchAll(/progress: (\d+)\//g)) onProgress?.(Number(match[1]));
  };
  client.stdout?.on('data', read);
  client.stderr?.on('data', read);
  const exitCode = await new Promise<number | null>((resolve) => client.once('exit', resolve));
  clearInterval(sampler);
  return { exitCode, seconds: (Date.now() - started) / 1000, peakMiB: Math.round(peak), output };
}

async function run(): Promise<void> {
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const docs = arg('--docs', 10_000);
  const small = Math.max(1, Math.round(docs / 10));
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'pipeline-bench-batch-'));
  const server = await startLocalDevServer(loadConfig(), { dbFilename: path.join(root, 'temporal.db') });
  const address = server.connection.options.address;
  const dataDir = path.join(root, 'data');
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    TEMPORAL_ADDRESS: address,
    DATA_DIR: dataDir,
    TEMPORAL_TASK_QUEUE: 'bench-batch',
    LOG_LEVEL: 'warn',
  };
  const workers: ChildProcess[] = [];
  const startWorker = (): ChildProcess => {
    const worker = tsx('src/cli/worker.ts', env);
    worker.stdout?.resume();
    worker.stderr?.resume();
    workers.push(worker);
    return worker;
  };
  try {
    console.log(`Writing ${docs} + ${small} documents...`);
    writeDocuments(path.join(root, 'big'), docs);
    writeDocuments(path.join(root, 'small'), small);
    let worker = startWorker();

    console.log(`A batch of ${small} documents (for the client's memory at a tenth of the size)...`);
    const smallRun = await runClient(env, path.join(root, 'small'));
    console.log(
      `  ${smallRun.seconds.toFixed(0)} s, client peak ${smallRun.peakMiB} MiB, exit ${smallRun.exitCode}`,
    );

    console.log(`A batch of ${docs} documents; the worker is killed (SIGKILL) about 40% of the way...`);
    let killedAt: number | undefined;
    const bigRun = await runClient(env, path.join(root, 'big'), (ended) => {
      if (killedAt !== undefined || ended < docs * 0.4) return;
      killedAt = ended;
      worker.kill('SIGKILL');
      console.log(`  SIGKILL of the worker at ${ended} documents ended; another one starts`);
      worker = startWorker();
    });
    console.log(
      `  ${bigRun.seconds.toFixed(0)} s, client peak ${bigRun.peakMiB} MiB, exit ${bigRun.exitCode}`,
    );
    for (const line of `${smallRun.output}\n${bigRun.output}`.split('\n')) {
      if (/^FAILED |failure\(s\)|published,/.test(line)) console.log(`  client: ${line}`);
    }

    // Every document published once: one publication each, no second revision.
    const db = new Database(path.join(dataDir, 'publications.db'), { readonly: true });
    const published = db.prepare('SELECT count(*) AS n FROM publications').get() as { n: number };
    const twice = db
      .prepare(
        'SELECT count(*) AS n FROM (SELECT document_id FROM revisions GROUP BY document_id HAVING count(*) > 1)',
      )
      .get() as { n: number };
    db.close();

    // The batch's runs: the chain of continue-as-new, each run's history length.
    const batchId = /Batch (batch-[0-9a-f]+)/.exec(bigRun.output)?.[1];
    const lengths: number[] = [];
    if (batchId !== undefined) {
      const handle = server.client.workflow.getHandle(batchId);
      const latest = await handle.fetchHistory();
      let runId =
        latest.events?.[0]?.workflowExecutionStartedEventAttributes?.firstExecutionRunId ?? undefined;
      while (runId) {
        const events = (await server.client.workflow.getHandle(batchId, runId).fetchHistory()).events ?? [];
        lengths.push(events.length);
        runId = events.at(-1)?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId ?? undefined;
      }
    }
    const figures = {
      documents: docs,
      seconds: Math.round(bigRun.seconds),
      docsPerSecond: Math.round((docs / bigRun.seconds) * 10) / 10,
      clientExitCode: bigRun.exitCode,
      published: published.n,
      publishedTwice: twice.n,
      workerKilledAtDocuments: killedAt,
      batchRuns: lengths.length,
      peakHistoryEventsPerRun: Math.max(0, ...lengths),
      clientPeakMiB: { [small]: smallRun.peakMiB, [docs]: bigRun.peakMiB },
    };
    console.log('');
    console.log(JSON.stringify(figures, null, 2));
    const ok =
      bigRun.exitCode === 0 &&
      published.n === docs + small &&
      twice.n === 0 &&
      figures.peakHistoryEventsPerRun < HISTORY_LIMIT;
    console.log(
      ok
        ? `All ${docs} documents published once; no batch run reached ${HISTORY_LIMIT} events.`
        : 'NOT AS PROMISED: see the figures above.',
    );
    fs.writeFileSync(path.join(__dirname, 'batch-results.json'), `${JSON.stringify(figures, null, 2)}\n`);
    if (!ok) process.exitCode = 1;
  } finally {
    for (const w of workers) w.kill('SIGKILL');
    await sleep(200);
    await server.teardown();
    fs.rmSync(root, { recursive: true, force: true });
  }
}

runMain(run);
