/**
 * `node --import tsx bench/stores.ts [--against DIR] [--rounds N] [--ops N] [--backend sqlite|postgres]
 * [--dir DIR]`: the stores' hot path, timed on both backends: a memo claim of a new key, the memo answer
 * (complete), a ledger claim of a new key and a publish of a new document. With `--against` another checkout
 * (a `git worktree` of an older commit, with a node_modules link) is timed in the same process through its own
 * openStores, the composition root every commit has, round for round in turn with this one: on a shared machine
 * the disk's fsync time swings tenfold from minute to minute, and only rounds run side by side compare. Each
 * round runs every operation `ops` times on fresh keys; printed per operation: the median round and the spread of
 * the rounds, and the median of the per-round ratios (this checkout / the other). `--dir /dev/shm` puts the
 * SQLite files in memory, which leaves the code's own cost. A benchmark, not a test: it asserts nothing. The
 * postgres rows need PostgreSQL at TEST_DATABASE_URL (by default the local one); each checkout gets a database
 * of its own, dropped at the end.
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

/** One checkout's stores, opened on a location of their own. */
interface Subject {
  name: string;
  stores: Stores;
  results: Record<Operation, number>[];
}

type Open = (config: ReturnType<typeof loadConfig>) => Promise<Stores>;

/** The openStores of another checkout (its src/store/open.ts), to time against this one's in the same process. */
async function openStoresOf(checkout: string): Promise<Open> {
  const loaded: unknown = await import(path.resolve(checkout, 'src/store/open.ts'));
  if (typeof loaded !== 'object' || loaded === null || !('openStores' in loaded)) {
    throw new Error(`${checkout}/src/store/open.ts has no openStores`);
  }
  const open = loaded.openStores;
  if (typeof open !== 'function')
    throw new Error(`${checkout}/src/store/open.ts: openStores is not a function`);
  return (config) => Promise.resolve(open(config)).then((stores: Stores) => stores);
}

const median = (values: number[]): number =>
  [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? NaN;

async function bench(
  backend: 'sqlite' | 'postgres',
  subjects: { name: string; open: Open }[],
  options: { rounds: number; ops: number; dir: string },
): Promise<void> {
  const admin = new pg.Client({ connectionString: ADMIN_URL });
  if (backend === 'postgres') await admin.connect();
  const cleanups: (() => Promise<unknown>)[] = [];
  try {
    const opened: Subject[] = [];
    for (const subject of subjects) {
      const dir = fs.mkdtempSync(path.join(options.dir, 'bench-stores-'));
      cleanups.push(async () => fs.rmSync(dir, { recursive: true, force: true }));
      let url: string | undefined;
      if (backend === 'postgres') {
        const database = `bench_stores_${randomUUID().replaceAll('-', '')}`;
        await admin.query(`CREATE DATABASE ${database}`);
        cleanups.push(() => admin.query(`DROP DATABASE ${database} WITH (FORCE)`));
        const u = new URL(ADMIN_URL);
        u.pathname = `/${database}`;
        url = u.toString();
      }
      const stores = await subject.open(
        loadConfig({ DATA_DIR: dir, ...(url && { DATABASE_URL: url }) }, dir),
      );
      cleanups.unshift(() => stores.close());
      opened.push({ name: subject.name, stores, results: [] });
    }
    // Warm up (prepared statements, the JIT, the pool's connections): a worker runs for hours. Then take turns,
    // the order swapped every round, so both meet the same load and neither always goes first.
    for (const subject of opened) await round(subject.stores, options.ops);
    for (let i = 0; i < options.rounds; i++) {
      for (const subject of i % 2 === 0 ? opened : [...opened].reverse()) {
        subject.results.push(await round(subject.stores, options.ops));
      }
    }
    for (const op of OPERATIONS) {
      const cells = opened.map((subject) => {
        const times = subject.results.map((r) => r[op]);
        const spread = `${Math.min(...times).toFixed(0)}–${Math.max(...times).toFixed(0)}`;
        return `${median(times).toFixed(0)} (${spread})`;
      });
      const [first, second] = opened;
      // Each round of the first against the same round of the second: the load they met was the same.
      const ratio =
        first === undefined || second === undefined
          ? ''
          : ` ${median(first.results.map((r, i) => r[op] / (second.results[i]?.[op] ?? NaN))).toFixed(2)} |`;
      console.log(`| ${backend} | ${op} | ${cells.join(' | ')} |${ratio}`);
    }
  } finally {
    for (const cleanup of cleanups) await cleanup();
    if (backend === 'postgres') await admin.end();
  }
}

runMain(async () => {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '7' },
      ops: { type: 'string', default: '200' },
      backend: { type: 'string' },
      against: { type: 'string' },
      dir: { type: 'string', default: os.tmpdir() },
    },
  });
  const backends = values.backend === undefined ? (['sqlite', 'postgres'] as const) : [values.backend];
  const subjects = [{ name: 'this checkout', open: openStores }];
  if (values.against !== undefined) {
    subjects.push({ name: values.against, open: await openStoresOf(values.against) });
  }
  const names = subjects.map((s) => `${s.name}: µs per call, median round (min–max)`);
  const ratio = subjects.length > 1 ? ' ratio (median of rounds) |' : '';
  console.log(`| backend | operation | ${names.join(' | ')} |${ratio}`);
  console.log(`|---|---|${subjects.map(() => '---:|').join('')}${ratio === '' ? '' : '---:|'}`);
  for (const backend of backends) {
    if (backend !== 'sqlite' && backend !== 'postgres') throw new Error(`--backend: sqlite or postgres`);
    await bench(backend, subjects, {
      rounds: Number(values.rounds),
      ops: Number(values.ops),
      dir: values.dir,
    });
  }
});
