/**
 * `node --import tsx scripts/bench-stores.ts [--rounds N] [--ops N] [--backend sqlite|postgres]`: the stores' hot
 * path, timed on both backends: a memo claim of a new key, the memo answer (complete), a ledger claim of a new
 * key and a publish of a new document. Opens the stores through openStores, the composition root every commit
 * has, so the same script times an older commit too (copy it there). Each round runs every operation `ops` times
 * on fresh keys; the median round is printed per operation, with the spread of the rounds, because the machine
 * this runs on is shared and noisy. A benchmark, not a test: it asserts nothing. Needs PostgreSQL at
 * TEST_DATABASE_URL (by default the local one) for the postgres rows; it makes a database and drops it.
 */
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { loadConfig } from '../src/config';
import { runMain } from '../src/lib/run-main';
import { openStores } from '../src/store/open';
import type { Stores } from '../src/store/open';

const ADMIN_URL = process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const OPERATIONS = ['memo claim', 'memo answer', 'ledger claim', 'publish'] as const;
type Operation = (typeof OPERATIONS)[number];

/** Runs every operation `ops` times on fresh keys; returns microseconds per call of each. */
async function round(stores: Stores, ops: number): Promise<Record<Operation, number>> {
  const tag = randomUUID();
  const keys = Array.from({ length: ops }, (_, i) => `${tag}-${i}`);
  const timed = async (work: (key: string) => Promise<unknown>): Promise<number> => {
    const start = process.hrtime.bigint();
    for (const key of keys) await work(key);
    return Number(process.hrtime.bigint() - start) / 1000 / ops;
  };
  const answer = { value: 'a summary', usage: { inputTokens: 10, outputTokens: 5 }, model: MODEL };
  return {
    'memo claim': await timed((key) =>
      stores.memo.claim(
        { memoKey: key, workflowId: `doc-${key}`, runId: 'run', step: 'summarize', requestHash: key },
        'owner',
        60_000,
      ),
    ),
    'memo answer': await timed((key) => stores.memo.complete(key, answer)),
    'ledger claim': await timed((key) =>
      stores.ledger.claim(
        {
          idempotencyKey: `run:${key}`,
          workflowId: `doc-${key}`,
          documentId: key,
          version: key,
          inFlightMs: 1,
        },
        'owner',
      ),
    ),
    publish: await timed((key) =>
      stores.publications().publish(
        {
          documentId: key,
          title: 'A title',
          textRef: `sha256:${'0'.repeat(64)}`,
          summary: 'A summary.',
          tags: ['a', 'b'],
          model: MODEL,
          scheduledAt: 1,
        },
        `run:${key}`,
      ),
    ),
  };
}

const MODEL = { provider: 'offline', model: 'bench' };

async function bench(backend: 'sqlite' | 'postgres', rounds: number, ops: number): Promise<void> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-stores-'));
  const database = `bench_stores_${randomUUID().replaceAll('-', '')}`;
  const admin = new pg.Client({ connectionString: ADMIN_URL });
  let url: string | undefined;
  if (backend === 'postgres') {
    await admin.connect();
    await admin.query(`CREATE DATABASE ${database}`);
    const u = new URL(ADMIN_URL);
    u.pathname = `/${database}`;
    url = u.toString();
  }
  const env = { DATA_DIR: dir, ...(url === undefined ? {} : { DATABASE_URL: url }) };
  const stores = await openStores(loadConfig(env, dir));
  try {
    await round(stores, Math.min(ops, 20)); // warm up: prepared statements, JIT, the pool's connections
    const results: Record<Operation, number>[] = [];
    for (let i = 0; i < rounds; i++) results.push(await round(stores, ops));
    for (const op of OPERATIONS) {
      const times = results.map((r) => r[op]).sort((a, b) => a - b);
      const median = times[Math.floor(times.length / 2)] ?? NaN;
      const spread = `${(times[0] ?? NaN).toFixed(0)}–${(times.at(-1) ?? NaN).toFixed(0)}`;
      console.log(`| ${backend} | ${op} | ${median.toFixed(0)} | ${spread} |`);
    }
  } finally {
    await stores.close();
    fs.rmSync(dir, { recursive: true, force: true });
    if (backend === 'postgres') {
      await admin.query(`DROP DATABASE ${database} WITH (FORCE)`);
      await admin.end();
    }
  }
}

runMain(async () => {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '7' },
      ops: { type: 'string', default: '200' },
      backend: { type: 'string' },
    },
  });
  const backends = values.backend === undefined ? (['sqlite', 'postgres'] as const) : [values.backend];
  console.log('| backend | operation | µs per call (median round) | rounds (min–max) |');
  console.log('|---|---|---:|---:|');
  for (const backend of backends) {
    if (backend !== 'sqlite' && backend !== 'postgres') throw new Error(`--backend: sqlite or postgres`);
    await bench(backend, Number(values.rounds), Number(values.ops));
  }
});
