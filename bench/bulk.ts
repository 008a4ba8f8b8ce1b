/**
 * `npm run bench:bulk [-- --docs 1000] [--provider openai|anthropic] [--max-requests 1000]`: a big batch in bulk
 * mode, end to end, as a person runs it: a file-backed dev server, `npm run worker`, and `npm run pipeline --
 * --bulk <folder>`, against the local stand-in of the provider's batch API (demo/batch-server.ts), whose
 * batches end a few seconds after they are created. It prints what the proof asks for, from the server's
 * own log and the client's closing lines:
 *
 * - the number of provider batches, and of requests in them; requests answered twice (0), calls one by one (0);
 * - every document published exactly once;
 * - the wall time, and what the batch cost at the batch price against the same answers one by one.
 */
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { LOCAL_BATCH_KEY, startBatchServer } from '../demo/batch-server';
import { loadConfig } from '../src/config';
import { runMain } from '../src/lib/run-main';
import { startLocalDevServer } from '../src/temporal/local-server';
import { writeDocuments } from './lib/documents';

const ROOT = path.resolve(__dirname, '..');

function arg(name: string, fallback: string): string {
  const at = process.argv.indexOf(name);
  return at === -1 ? fallback : (process.argv[at + 1] ?? fallback);
}

function tsx(script: string, env: NodeJS.ProcessEnv, args: string[] = []): ChildProcess {
  return spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, script), ...args], {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

async function run(): Promise<void> {
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const docs = Number(arg('--docs', '1000'));
  const provider = arg('--provider', 'openai') === 'anthropic' ? 'anthropic' : 'openai';
  const maxRequests = arg('--max-requests', '1000');
  const batchSeconds = Number(arg('--batch-seconds', '5'));
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'pipeline-bench-bulk-'));
  const server = await startLocalDevServer(loadConfig(), { dbFilename: path.join(root, 'temporal.db') });
  const batches = await startBatchServer({ completeAfterMs: batchSeconds * 1000 });
  const dataDir = path.join(root, 'data');
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    TEMPORAL_ADDRESS: server.connection.options.address,
    DATA_DIR: dataDir,
    TEMPORAL_TASK_QUEUE: 'bench-bulk',
    LOG_LEVEL: 'warn',
    ...(provider === 'openai'
      ? { MODEL: 'openai:gpt-4o-mini', OPENAI_BASE_URL: batches.baseUrl, OPENAI_API_KEY: LOCAL_BATCH_KEY }
      : {
          MODEL: 'anthropic:claude-haiku-4-5',
          ANTHROPIC_BASE_URL: batches.baseUrl,
          ANTHROPIC_API_KEY: LOCAL_BATCH_KEY,
        }),
    BULK_MAX_REQUESTS: maxRequests,
    BULK_POLL_SECONDS: '2',
    BULK_POLL_MAX_SECONDS: '10',
  };
  const worker = tsx('src/cli/worker.ts', env);
  worker.stdout?.resume();
  worker.stderr?.resume();
  try {
    console.log(`Writing ${docs} documents...`);
    writeDocuments(path.join(root, 'docs'), docs);
    console.log(
      `npm run pipeline -- --bulk: ${docs} documents, ${provider}'s batch API, at most ${maxRequests} requests a batch...`,
    );
    const started = Date.now();
    const client = tsx('src/cli/pipeline.ts', env, ['--bulk', path.join(root, 'docs')]);
    let output = '';
    client.stdout?.on('data', (c: Buffer) => (output += c.toString('utf8')));
    client.stderr?.on('data', (c: Buffer) => (output += c.toString('utf8')));
    const exitCode = await new Promise<number | null>((resolve) => client.once('exit', resolve));
    const seconds = (Date.now() - started) / 1000;
    for (const line of output.split('\n'))
      if (/^(Bulk:|FAILED )|published,/.test(line)) console.log(`  client: ${line}`);

    const db = new Database(path.join(dataDir, 'publications.db'), { readonly: true });
    const published = (db.prepare('SELECT count(*) AS n FROM publications').get() as { n: number }).n;
    const twice = (
      db
        .prepare(
          'SELECT count(*) AS n FROM (SELECT document_id FROM revisions GROUP BY document_id HAVING count(*) > 1)',
        )
        .get() as { n: number }
    ).n;
    db.close();
    const answered = new Map<string, number>();
    for (const b of batches.batches)
      for (const l of b.lines)
        if (l.outcome === 'answered') answered.set(l.customId, (answered.get(l.customId) ?? 0) + 1);
    const created = batches.batches.map((b) => b.createdAt);
    const ended = batches.batches.map((b) => b.endedAt ?? Date.now());
    const cost = /bought at the batch price, \$([\d.]+); one by one they would have cost \$([\d.]+)/.exec(
      output,
    );
    const figures = {
      documents: docs,
      provider,
      providerBatches: batches.batches.length,
      requests: batches.batches.reduce((n, b) => n + b.lines.length, 0),
      answeredTwice: [...answered.values()].filter((n) => n > 1).length,
      callsOneByOne: batches.direct.length,
      published,
      publishedTwice: twice,
      clientExitCode: exitCode,
      wallSeconds: Math.round(seconds),
      providerBatchSeconds: Math.round((Math.max(...ended) - Math.min(...created)) / 1000),
      costAtBatchPriceUsd: cost === null ? null : Number(cost[1]),
      costOneByOneUsd: cost === null ? null : Number(cost[2]),
    };
    console.log('');
    console.log(JSON.stringify(figures, null, 2));
    const ok =
      exitCode === 0 &&
      published === docs &&
      twice === 0 &&
      figures.answeredTwice === 0 &&
      figures.callsOneByOne === 0 &&
      figures.requests === docs * 2;
    console.log(
      ok
        ? `All ${docs} documents published once, every answer bought once in a provider batch.`
        : 'NOT AS PROMISED: see the figures above.',
    );
    fs.writeFileSync(
      path.join(__dirname, `bulk-results-${provider}.json`),
      `${JSON.stringify(figures, null, 2)}\n`,
    );
    if (!ok) process.exitCode = 1;
  } finally {
    worker.kill('SIGKILL');
    await sleep(200);
    await batches.close();
    await server.teardown();
    fs.rmSync(root, { recursive: true, force: true });
  }
}

runMain(run);
