/**
 * The pipeline at a provider's rate limits, from the outside, as a user runs it: a Temporal dev server,
 * `npm run worker` (one or two) and `npm run pipeline <folder>` as processes, and a model provider that enforces
 * requests and tokens per minute the way OpenAI and Anthropic document it (test/provider-limits.ts: refilling
 * buckets at a one-second grain, 429 with Retry-After and the limit headers). Chapters of the Rust book, cut into
 * documents, go through it with the limits configured, and with the limits learned from the provider's headers
 * alone: on one worker, on two workers sharing a PostgreSQL database, and against Anthropic's Messages API.
 *
 * Each run must publish every document, pay no answer twice, draw at most one refusal (429) per twenty successful
 * calls, and take no more than 1.15 times the time the limits themselves need for the calls and tokens it made.
 * The evidence is the provider's own log and the client's output and exit code.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { TestContext } from 'node:test';
import { startWorkerProcess } from '../src/cli/demo/worker-process';
import type { WorkerProcess } from '../src/cli/demo/worker-process';
import { devServerEnv, installQuietRuntime } from './helpers';
import { freshDatabase } from './postgres';
import { startLimitedProvider } from './provider-limits';
import type { ProviderLimits, ProviderStats } from './provider-limits';
import { cleanupAfterAll, scratchDir } from './scratch';
import type { Defer } from './scratch';

installQuietRuntime();
const defer = cleanupAfterAll();
const ROOT = path.resolve(__dirname, '..');
const CORPUS = path.join(__dirname, 'fixtures', 'corpus', 'rust-book');

/**
 * 120 requests a minute binds the run overall; 120,000 tokens a minute binds while the longer documents go through
 * (a call over 1,000 tokens takes longer than half a second of the token bucket), about a third of the calls.
 */
const LIMITS: ProviderLimits = { rpm: 120, tpm: 120_000 };
/**
 * Anthropic's: the same requests, the token limit as input tokens a minute, and an output limit the answers stay
 * far below. Each request reserves its max_tokens of it until the answer settles it, as Anthropic documents: a call
 * that sets no maximum reserves the model's whole 64,000 (the AI SDK's default for claude-haiku-4-5).
 */
const ANTHROPIC_LIMITS: ProviderLimits = { ...LIMITS, otpm: 60_000 };
/** A model that answers in a tenth of a second: calls overlap, as real ones do. */
const ANSWER_DELAY_MS = 100;
/** The most time a run may take, against the time the limits need for its calls and tokens. */
const MAX_RATIO = 1.15;
/**
 * Seconds on top, for what no limiter can avoid: the first calls start one at a time as the batch's first
 * workflows are dispatched, and the last document's tag call waits for its summary to be recorded (a workflow task
 * and an activity dispatch), so the run's two ends are not at the limit.
 */
const SLACK_SECONDS = 2;
/** At most one refusal (429) per this many successful calls. */
const CALLS_PER_REFUSAL = 20;
/** How long the client may take (the limits need about 30 s) before the test kills it and fails. */
const RUN_DEADLINE_MS = 150_000;

/** Chapters of the Rust book cut at their `##`/`###` headings into documents of at least 1,000 characters. */
function writeDocuments(dir: string): number {
  const pieces: string[] = [];
  for (const file of fs
    .readdirSync(CORPUS)
    .filter((f) => /^ch.*\.md$/.test(f))
    .sort()) {
    let current = '';
    for (const section of fs.readFileSync(path.join(CORPUS, file), 'utf8').split(/\n(?=#{2,3} )/)) {
      current = current === '' ? section : `${current}\n${section}`;
      if (current.length >= 1000) {
        pieces.push(current);
        current = '';
      }
    }
    if (current === '') continue;
    // A short end joins the piece before it.
    const last = pieces.pop();
    pieces.push(last === undefined ? current : `${last}\n${current}`);
  }
  pieces.forEach((text, i) =>
    fs.writeFileSync(path.join(dir, `part-${String(i + 1).padStart(2, '0')}.md`), text),
  );
  return pieces.length;
}

/** This process's environment without the pipeline's own settings: each run sets the ones it means. */
function baseEnvironment(): NodeJS.ProcessEnv {
  const kept = { ...process.env };
  const settings =
    /^(MODEL|OPENAI_|ANTHROPIC_|DATABASE_URL$|DATA_DIR$|TEMPORAL_(ADDRESS|NAMESPACE|TASK_QUEUE|API_KEY|TLS_)|BATCH_WINDOW$|MAX_PROVIDER_ERRORS$|STEP_BUDGET_MINUTES$|METRICS_PORT$|OTEL_|LOG_LEVEL$)/;
  for (const name of Object.keys(kept)) if (settings.test(name)) delete kept[name];
  return kept;
}

interface ClientRun {
  code: number | null;
  output: string;
  /** It did not end within RUN_DEADLINE_MS, and was killed. */
  timedOut: boolean;
}

/** `npm run pipeline <dir>` to its end, or killed at RUN_DEADLINE_MS. */
function runClient(env: NodeJS.ProcessEnv, dir: string, later: Defer): Promise<ClientRun> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'pipeline.ts'), dir],
    {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  later(() => void child.kill('SIGKILL'));
  let output = '';
  let timedOut = false;
  child.stdout.on('data', (c: Buffer) => (output += c.toString('utf8')));
  child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
  const deadline = setTimeout(() => {
    timedOut = true;
    child.kill('SIGKILL');
  }, RUN_DEADLINE_MS);
  return new Promise((resolve) => {
    child.once('close', (code) => {
      clearTimeout(deadline);
      resolve({ code, output, timedOut });
    });
  });
}

interface Run {
  what: string;
  provider: 'openai-compatible' | 'anthropic';
  /** MODEL_RPM and MODEL_TPM in the workers' environment; otherwise the limits come from the headers alone. */
  configured: boolean;
  workers: number;
  /** One PostgreSQL database (DATABASE_URL) for the workers and the client; otherwise one data folder. */
  postgres: boolean;
}

const RUNS: Run[] = [
  {
    what: 'one worker, the limits configured',
    provider: 'openai-compatible',
    configured: true,
    workers: 1,
    postgres: false,
  },
  {
    what: 'one worker, the limits learned from the headers alone',
    provider: 'openai-compatible',
    configured: false,
    workers: 1,
    postgres: false,
  },
  {
    what: 'two workers on one PostgreSQL database, the limits learned from the headers',
    provider: 'openai-compatible',
    configured: false,
    workers: 2,
    postgres: true,
  },
  {
    what: "Anthropic's Messages API, one worker, the limits learned from the headers",
    provider: 'anthropic',
    configured: false,
    workers: 1,
    postgres: false,
  },
];

/** The client's closing line: `N of M document(s) published, ... K failed.` */
function tallyOf(output: string): { published: number; total: number; failed: number } | undefined {
  const match = /(\d+) of (\d+) document\(s\) published,.*?(\d+) failed/.exec(output);
  if (match === null) return undefined;
  return { published: Number(match[1]), total: Number(match[2]), failed: Number(match[3]) };
}

/** The figures a closing note quotes. */
function figures(stats: ProviderStats, limits: ProviderLimits): string {
  const ratio = stats.limitSeconds === 0 ? 0 : stats.wallSeconds / stats.limitSeconds;
  return (
    `${stats.answered} calls answered, ${stats.refused} refused (429: ${(stats.refused / Math.max(1, stats.answered)).toFixed(3)} per call), ` +
    `${stats.overloaded} overloaded, ${stats.paidTwice.length} keys paid twice; model calls took ` +
    `${stats.wallSeconds.toFixed(1)} s against the limit's own ${stats.limitSeconds.toFixed(1)} s ` +
    `(${ratio.toFixed(2)}x; ${stats.tokens} tokens), ${stats.callsPerMinute.toFixed(0)} calls/min against ${limits.rpm}`
  );
}

/**
 * Cleanups for one run: run when it ends, so the next starts on a quiet machine, and registered for the end of the
 * file too, in case it never ends (each runs once).
 */
function runScope(): { later: Defer; end(): Promise<void> } {
  const cleanups: (() => Promise<void>)[] = [];
  return {
    later: (cleanup) => {
      let done: Promise<void> | undefined;
      const once = (): Promise<void> => (done ??= Promise.resolve().then(cleanup));
      cleanups.push(once);
      defer(once);
    },
    end: async () => {
      for (const cleanup of cleanups.reverse()) await cleanup();
    },
  };
}

async function runAtTheLimit(t: TestContext, run: Run): Promise<void> {
  const scope = runScope();
  try {
    await runOnce(t, run, scope.later);
  } finally {
    await scope.end();
  }
}

async function runOnce(t: TestContext, run: Run, later: Defer): Promise<void> {
  const dir = scratchDir(defer, 'provider-limits-run-');
  const documents = path.join(dir, 'documents');
  fs.mkdirSync(documents);
  const count = writeDocuments(documents);
  // A server of its own: the same documents on one server would be found done by the next run.
  const server = await devServerEnv();
  later(() => server.teardown());
  const limits = run.provider === 'anthropic' ? ANTHROPIC_LIMITS : LIMITS;
  const provider = await startLimitedProvider({ limits, answerDelayMs: ANSWER_DELAY_MS });
  later(() => provider.close());
  const databaseUrl = run.postgres ? await freshDatabase(defer) : undefined;

  // Each worker calls the provider through a route of its own (`<origin>/<route>/v1`), to tell whose call it is.
  const origin = new URL(provider.baseUrl).origin;
  const modelSettings = (route: string): NodeJS.ProcessEnv =>
    run.provider === 'anthropic'
      ? {
          MODEL: 'anthropic:claude-haiku-4-5',
          ANTHROPIC_BASE_URL: `${origin}/${route}/v1`,
          ANTHROPIC_API_KEY: 'test',
        }
      : { MODEL: 'openai-compatible:gpt-4o-mini', OPENAI_BASE_URL: `${origin}/${route}/v1` };
  const shared: NodeJS.ProcessEnv = {
    ...baseEnvironment(),
    TEMPORAL_ADDRESS: server.address,
    TEMPORAL_TASK_QUEUE: `provider-limits-${randomUUID()}`,
    LOG_LEVEL: 'warn',
    ...(databaseUrl === undefined ? { DATA_DIR: path.join(dir, 'data') } : { DATABASE_URL: databaseUrl }),
  };
  const workers: WorkerProcess[] = [];
  later(async () => {
    for (const worker of workers) await worker.kill();
  });
  for (let i = 1; i <= run.workers; i++) {
    const worker = await startWorkerProcess(
      {
        ...shared,
        ...modelSettings(`worker-${i}`),
        ...(run.configured ? { MODEL_RPM: String(limits.rpm), MODEL_TPM: String(limits.tpm) } : {}),
        // Two workers share nothing but the database: each has a data folder of its own.
        ...(databaseUrl === undefined ? {} : { DATA_DIR: path.join(dir, `worker-${i}`) }),
      },
      { readyTimeoutMs: 120_000 },
    );
    workers.push(worker);
  }

  const client = await runClient(
    {
      ...shared,
      ...modelSettings('client'),
      ...(databaseUrl === undefined ? {} : { DATA_DIR: path.join(dir, 'client') }),
    },
    documents,
    later,
  );
  for (const worker of workers) await worker.kill();

  const stats = provider.stats();
  if (process.env.PROVIDER_LIMITS_DUMP !== undefined)
    fs.writeFileSync(process.env.PROVIDER_LIMITS_DUMP, JSON.stringify(stats.calls, null, 1));
  const tally = tallyOf(client.output);
  const failures = client.output.split('\n').filter((line) => line.startsWith('FAILED '));
  const outcome =
    tally === undefined
      ? `the client ended with no tally (${client.timedOut ? 'killed at its deadline' : `exit ${client.code}`}), ` +
        `${failures.length} FAILED so far`
      : `${tally.published} of ${count} published, ${tally.failed} failed`;
  t.diagnostic(`${run.what}: ${outcome}; ${figures(stats, limits)}`);
  for (const line of failures.slice(0, 3)) t.diagnostic(`  ${line.slice(0, 400)}`);
  const workersCalling = new Set(stats.calls.map((c) => c.route));
  const said = `the client printed:\n${client.output.slice(-3000)}`;

  assert.ok(!client.timedOut, `npm run pipeline did not end within ${RUN_DEADLINE_MS / 1000} s; ${said}`);
  assert.deepEqual(tally, { published: count, total: count, failed: 0 }, said);
  assert.equal(client.code, 0, said);
  assert.deepEqual(stats.paidTwice, [], 'answers paid twice');
  assert.deepEqual(
    [...new Set(stats.calls.map((c) => c.api))],
    [run.provider === 'anthropic' ? 'messages' : 'chat'],
  );
  assert.equal(workersCalling.size, run.workers, `calls came through ${[...workersCalling].join(', ')}`);
  assert.ok(
    stats.refused * CALLS_PER_REFUSAL <= stats.answered,
    `${stats.refused} refusals for ${stats.answered} successful calls: more than 1 in ${CALLS_PER_REFUSAL}`,
  );
  assert.ok(
    stats.wallSeconds <= MAX_RATIO * stats.limitSeconds + SLACK_SECONDS,
    `the model calls took ${stats.wallSeconds.toFixed(1)} s, more than ${MAX_RATIO} x the ` +
      `${stats.limitSeconds.toFixed(1)} s the limits need (+${SLACK_SECONDS} s)`,
  );
}

describe("the pipeline at a provider's rate limits", () => {
  for (const run of RUNS) {
    it(`runs at the limit and never fails on it: ${run.what}`, { timeout: 360_000 }, (t) =>
      runAtTheLimit(t, run),
    );
  }
});
