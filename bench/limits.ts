/**
 * `npm run bench:limits`: the pipeline at a provider's rate limits, and what one turn costs in the shared store.
 *
 * 1. The documents of test/provider-limits-run.ts (chapters of the Rust book) through `npm run worker` and
 *    `npm run pipeline` as processes, against the rate-limited stand-in provider (test/provider-limits.ts, one-second
 *    buckets), with no MODEL_RPM / MODEL_TPM: the limits are learned from its headers. One worker on a data folder
 *    and two workers on one PostgreSQL database, at two limits, one where requests bind and one where tokens do.
 *    For each: published and failed, calls and tokens a minute against the limit, refusals (429) per successful
 *    call, and the model calls' wall time against two yardsticks computed from the provider's own log: the limit's
 *    own time for the calls and tokens answered, and the bound a strictly in-order client cannot beat under
 *    one-second buckets (each call waits for its own request and tokens: the sum of max(60/rpm, tokens·60/tpm)).
 * 2. SqlRateLimits' turn as Pacer.run takes it (the characters-a-token read, reserve, end), timed on the SQLite file
 *    and on PostgreSQL by one handle and by two handles at once, each a process of its own as a worker is.
 *
 * Prints both, and writes them to bench/limits-results.json. A benchmark, not a test: it asserts nothing, but ends
 * non-zero when a run did not publish every document. Needs PostgreSQL at TEST_DATABASE_URL (by default the local
 * one, trust auth): each part gets a database of its own, dropped at the end. About 3 minutes on 2 cores.
 */
import { spawn } from 'node:child_process';
import type { ChildProcessByStdio } from 'node:child_process';
import os from 'node:os';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import * as prettier from 'prettier';
import { z } from 'zod';
import { loadConfig } from '../src/config';
import { runMain } from '../src/lib/run-main';
import { openStores } from '../src/store/open';
import { installQuietRuntime } from '../test/helpers';
import { freshDatabase } from '../test/postgres';
import type { ProviderLimits, ProviderStats } from '../test/provider-limits';
import { ANSWER_DELAY_MS, figures, runAtLimits } from '../test/provider-limits-run';
import type { Cleanup, Defer } from '../test/scratch';
import { tempDir } from '../test/scratch';

const ROOT = path.resolve(__dirname, '..');
const RESULTS_FILE = path.join(__dirname, 'limits-results.json');

/**
 * Two limits, each binding on one dimension (the batch's calls are 0.5k to 4k tokens): 120 requests a minute with
 * tokens to spare, where the requests bind all but the few longest calls, and OpenAI's tier-1 limits for
 * gpt-4o-mini, where the tokens bind every call.
 */
const LIMITS: { binds: 'requests' | 'tokens'; limits: ProviderLimits }[] = [
  { binds: 'requests', limits: { rpm: 120, tpm: 400_000 } },
  { binds: 'tokens', limits: { rpm: 500, tpm: 200_000 } },
];
const FLEETS: { workers: number; store: 'sqlite' | 'postgres' }[] = [
  { workers: 1, store: 'sqlite' },
  { workers: 2, store: 'postgres' },
];
/** How long a client may take (each limit needs about 30 s for the batch) before it is killed. */
const RUN_DEADLINE_MS = 150_000;
/** Turns each handle takes in the store's timing, after its warm-up. */
const TURNS = 300;

interface RunFigures {
  binds: 'requests' | 'tokens';
  limits: ProviderLimits;
  workers: number;
  store: 'sqlite' | 'postgres';
  documents: number;
  published: number | null;
  failed: number | null;
  answered: number;
  refused: number;
  overloaded: number;
  paidTwice: number;
  refusalsPerCall: number;
  callsPerMinute: number;
  tokensPerMinute: number;
  tokens: number;
  wallSeconds: number;
  limitSeconds: number;
  inOrderSeconds: number;
  wallToLimit: number;
  wallToInOrder: number;
}

/** What bench/lib/limit-turns.ts prints: the milliseconds of each part of each turn. */
const TurnTimesSchema = z.object({
  read: z.array(z.number()),
  reserve: z.array(z.number()),
  end: z.array(z.number()),
  /** Reservations answered busy (another handle's call went first to learn the limits), taken again. */
  busy: z.number(),
  /** From the first turn to the last. */
  seconds: z.number(),
});
export type TurnTimes = z.infer<typeof TurnTimesSchema>;

interface Percentiles {
  p50: number;
  p95: number;
}

interface TurnFigures {
  store: 'sqlite' | 'postgres';
  handles: number;
  turnsEach: number;
  /** Milliseconds, over every handle's turns. */
  read: Percentiles;
  reserve: Percentiles;
  end: Percentiles;
  reserveAndEnd: Percentiles;
  turn: Percentiles;
  /** Turns the store gave, all handles together, a second. */
  turnsPerSecond: number;
}

/** Cleanups run in the reverse of their order, as test/scratch.ts's registry runs them after a file's tests. */
function cleanupScope(): { defer: Defer; end(): Promise<void> } {
  const cleanups: Cleanup[] = [];
  return {
    defer: (cleanup) => void cleanups.push(cleanup),
    end: async () => {
      for (const cleanup of cleanups.reverse()) await cleanup();
    },
  };
}

/**
 * The least time a client that sends each call only after the one before it was admitted needs, under buckets of
 * one second's worth: each answered call waits for its own request and its own tokens, whichever takes longer.
 */
function inOrderSeconds(stats: ProviderStats, limits: ProviderLimits): number {
  let seconds = 0;
  for (const call of stats.calls) {
    if (call.status === undefined || call.status < 200 || call.status >= 300) continue;
    seconds += Math.max(
      60 / limits.rpm,
      (60 * call.tokens) / limits.tpm,
      limits.otpm === undefined ? 0 : (60 * call.outputTokens) / limits.otpm,
    );
  }
  return seconds;
}

const round = (n: number, digits = 2): number => Number(n.toFixed(digits));

async function pipelineRun(
  binds: 'requests' | 'tokens',
  limits: ProviderLimits,
  fleet: { workers: number; store: 'sqlite' | 'postgres' },
): Promise<RunFigures> {
  const scope = cleanupScope();
  try {
    const dir = tempDir('bench-limits-');
    scope.defer(() => fs.rmSync(dir, { recursive: true, force: true }));
    const ran = await runAtLimits(
      {
        provider: 'openai-compatible',
        limits,
        configured: false,
        workers: fleet.workers,
        databaseUrl: fleet.store === 'postgres' ? await freshDatabase(scope.defer) : undefined,
        deadlineMs: RUN_DEADLINE_MS,
      },
      dir,
      scope.defer,
    );
    const { stats } = ran;
    const what = `${fleet.workers} worker(s) on ${fleet.store}, ${limits.rpm} requests and ${limits.tpm} tokens a minute`;
    console.log(`${what}: ${ran.outcome}; ${figures(stats, limits)}`);
    for (const line of ran.failures.slice(0, 3)) console.log(`  ${line.slice(0, 400)}`);
    const inOrder = inOrderSeconds(stats, limits);
    return {
      binds,
      limits,
      ...fleet,
      documents: ran.documents,
      published: ran.tally?.published ?? null,
      failed: ran.tally?.failed ?? null,
      answered: stats.answered,
      refused: stats.refused,
      overloaded: stats.overloaded,
      paidTwice: stats.paidTwice.length,
      refusalsPerCall: round(stats.refused / Math.max(1, stats.answered), 3),
      callsPerMinute: round(stats.callsPerMinute, 1),
      tokensPerMinute: Math.round(stats.wallSeconds === 0 ? 0 : (stats.tokens * 60) / stats.wallSeconds),
      tokens: stats.tokens,
      wallSeconds: round(stats.wallSeconds, 1),
      limitSeconds: round(stats.limitSeconds, 1),
      inOrderSeconds: round(inOrder, 1),
      wallToLimit: round(stats.limitSeconds === 0 ? 0 : stats.wallSeconds / stats.limitSeconds),
      wallToInOrder: round(inOrder === 0 ? 0 : stats.wallSeconds / inOrder),
    };
  } finally {
    await scope.end();
  }
}

function percentiles(values: number[]): Percentiles {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN;
  return { p50: round(at(0.5)), p95: round(at(0.95)) };
}

type TurnProcess = ChildProcessByStdio<Writable, Readable, null>;

/** Starts one handle's process (bench/lib/limit-turns.ts); resolves once it has warmed up. */
async function startHandle(
  env: NodeJS.ProcessEnv,
  handle: string,
): Promise<{ child: TurnProcess; lines: readline.Interface }> {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      path.join(__dirname, 'lib', 'limit-turns.ts'),
      '--handle',
      handle,
      '--turns',
      String(TURNS),
    ],
    { cwd: ROOT, env, stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const lines = readline.createInterface({ input: child.stdout });
  const exited = new Promise<never>((_, reject) =>
    child.once('exit', (code) => reject(new Error(`${handle} ended (exit ${code}) before it was ready`))),
  );
  const ready = new Promise<void>((resolve) =>
    lines.on('line', (line) => {
      if (line === 'ready') resolve();
    }),
  );
  await Promise.race([ready, exited]);
  exited.catch(() => undefined);
  return { child, lines };
}

/** One handle or several at once taking turns on one store; their times pooled. */
async function storeTurns(store: 'sqlite' | 'postgres', handles: number): Promise<TurnFigures> {
  const scope = cleanupScope();
  try {
    const dir = tempDir('bench-limits-turns-');
    scope.defer(() => fs.rmSync(dir, { recursive: true, force: true }));
    const databaseUrl = store === 'postgres' ? await freshDatabase(scope.defer) : undefined;
    const env: NodeJS.ProcessEnv = { ...process.env, DATA_DIR: dir, LOG_LEVEL: 'warn' };
    delete env.DATABASE_URL;
    if (databaseUrl !== undefined) env.DATABASE_URL = databaseUrl;
    // The schema, brought up to date once, before the handles open it together.
    await (await openStores(loadConfig(env, dir))).close();

    const started = await Promise.all(
      Array.from({ length: handles }, (_, i) => startHandle(env, `handle-${i + 1}`)),
    );
    for (const { child } of started) scope.defer(() => void child.kill('SIGKILL'));
    const results = started.map(
      ({ lines }) =>
        new Promise<TurnTimes>((resolve) =>
          lines.on('line', (line) => {
            if (line.startsWith('{')) resolve(TurnTimesSchema.parse(JSON.parse(line)));
          }),
        ),
    );
    for (const { child } of started) child.stdin.end('go\n');
    const times = await Promise.all(results);
    const pooled = (pick: (t: TurnTimes, i: number) => number): number[] =>
      times.flatMap((t) => t.reserve.map((_, i) => pick(t, i)));
    const at = (values: number[], i: number): number => values[i] ?? NaN;
    return {
      store,
      handles,
      turnsEach: TURNS,
      read: percentiles(pooled((t, i) => at(t.read, i))),
      reserve: percentiles(pooled((t, i) => at(t.reserve, i))),
      end: percentiles(pooled((t, i) => at(t.end, i))),
      reserveAndEnd: percentiles(pooled((t, i) => at(t.reserve, i) + at(t.end, i))),
      turn: percentiles(pooled((t, i) => at(t.read, i) + at(t.reserve, i) + at(t.end, i))),
      turnsPerSecond: Math.round((handles * TURNS) / Math.max(...times.map((t) => t.seconds))),
    };
  } finally {
    await scope.end();
  }
}

/** The machine's load average over the last 1, 5 and 15 minutes. */
const loadAverage = (): number[] => os.loadavg().map((n) => round(n));

const pct = (p: Percentiles): string => `${p.p50} / ${p.p95}`;

runMain(async () => {
  installQuietRuntime();
  const began = Date.now();
  const measuredAt = new Date().toISOString();
  const loadAtStart = loadAverage();
  console.log(
    `npm run bench:limits, ${measuredAt}: the limits learned from the provider's headers (no MODEL_RPM/TPM), ` +
      `one-second buckets, answers in ${ANSWER_DELAY_MS} ms; ${os.cpus().length} cores, node ${process.version}, ` +
      `load average ${loadAverage()} (others' work on the machine skews the figures)`,
  );
  const runs: RunFigures[] = [];
  for (const { binds, limits } of LIMITS)
    for (const fleet of FLEETS) runs.push(await pipelineRun(binds, limits, fleet));

  const turns: TurnFigures[] = [];
  for (const store of ['sqlite', 'postgres'] as const)
    for (const handles of [1, 2]) turns.push(await storeTurns(store, handles));

  const documents = runs[0]?.documents ?? 0;
  console.log(`\nAt the limit: ${documents} documents, ${2 * documents} model calls a run`);
  console.log(
    '| limit (binds) | workers (store) | published / failed | calls/min (limit) | tokens/min (limit) | 429 per call ' +
      "| model calls' wall time | the limit's own time | ratio | in-order bound | ratio |",
  );
  console.log('|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of runs) {
    console.log(
      `| ${r.limits.rpm} rpm, ${r.limits.tpm} tpm (${r.binds}) | ${r.workers} (${r.store}) ` +
        `| ${r.published ?? '?'} / ${r.failed ?? '?'} | ${r.callsPerMinute} (${r.limits.rpm}) ` +
        `| ${r.tokensPerMinute} (${r.limits.tpm}) | ${r.refusalsPerCall} | ${r.wallSeconds} s | ${r.limitSeconds} s ` +
        `| ${r.wallToLimit}x | ${r.inOrderSeconds} s | ${r.wallToInOrder}x |`,
    );
  }
  console.log(`\nOne turn in the shared store, ms p50 / p95 (${TURNS} turns a handle, after a warm-up)`);
  console.log(
    '| store | handles at once | read | reserve | end | reserve + end | turn (all three) | turns a second, in all |',
  );
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
  for (const t of turns) {
    console.log(
      `| ${t.store} | ${t.handles} | ${pct(t.read)} | ${pct(t.reserve)} | ${pct(t.end)} ` +
        `| ${pct(t.reserveAndEnd)} | ${pct(t.turn)} | ${t.turnsPerSecond} |`,
    );
  }

  const results = {
    measuredAt,
    command: 'npm run bench:limits',
    machine: {
      cpus: os.cpus().length,
      node: process.version,
      loadAverageAtStart: loadAtStart,
      loadAverageAtEnd: loadAverage(),
    },
    provider: { grainSeconds: 1, answerDelayMs: ANSWER_DELAY_MS, limitsLearnedFromHeaders: true },
    runs,
    turns,
  };
  // In the repository's own format (npm run lint checks it): prettier lays short arrays on one line.
  fs.mkdirSync(path.dirname(RESULTS_FILE), { recursive: true });
  const json = await prettier.format(JSON.stringify(results, null, 2), {
    ...(await prettier.resolveConfig(RESULTS_FILE)),
    filepath: RESULTS_FILE,
  });
  fs.writeFileSync(RESULTS_FILE, json);
  console.log(
    `\nWrote ${path.relative(ROOT, RESULTS_FILE)} (${Math.round((Date.now() - began) / 1000)} s in all; ` +
      `load average ${loadAverage()}).`,
  );
  if (runs.some((r) => r.published !== r.documents)) {
    console.log('Some run did not publish every document: see its line above.');
    process.exitCode = 1;
  }
});
