/**
 * The pipeline at a provider's rate limits, run from the outside as a user runs it: a Temporal dev server,
 * `npm run worker` (one or more) and `npm run pipeline <folder>` as processes, against a provider that enforces
 * requests and tokens per minute (test/provider-limits.ts). Chapters of the Rust book, cut into documents, go
 * through it. What one such run takes and gives back, shared by the test that asserts on it
 * (test/provider-limits-run.test.ts) and the benchmark that prints it (`npm run bench:limits`).
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { startWorkerProcess } from '../demo/worker-process';
import type { WorkerProcess } from '../demo/worker-process';
import { devServerEnv } from './helpers';
import { startLimitedProvider } from './provider-limits';
import type { LimitedProvider, ProviderLimits, ProviderStats } from './provider-limits';
import type { Defer } from './scratch';

const ROOT = path.resolve(__dirname, '..');
const CORPUS = path.join(__dirname, 'fixtures', 'corpus', 'rust-book');

/** A model that answers in a tenth of a second: calls overlap, as real ones do. */
export const ANSWER_DELAY_MS = 100;

/** Chapters of the Rust book cut at their `##`/`###` headings into documents of at least 1,000 characters. */
function writeDocuments(dir: string, most = Infinity): number {
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
  const kept = pieces.slice(0, most);
  kept.forEach((text, i) =>
    fs.writeFileSync(path.join(dir, `part-${String(i + 1).padStart(2, '0')}.md`), text),
  );
  return kept.length;
}

/** This process's environment without the pipeline's own settings: each run sets the ones it means. */
export function baseEnvironment(): NodeJS.ProcessEnv {
  const kept = { ...process.env };
  const settings =
    /^(MODEL|OPENAI_|ANTHROPIC_|DATABASE_URL$|DATA_DIR$|TEMPORAL_(ADDRESS|NAMESPACE|TASK_QUEUE|API_KEY|TLS_)|BATCH_WINDOW$|BULK|MAX_PROVIDER_ERRORS$|STEP_BUDGET_MINUTES$|METRICS_PORT$|OTEL_|LOG_LEVEL$)/;
  for (const name of Object.keys(kept)) if (settings.test(name)) delete kept[name];
  return kept;
}

export interface ClientRun {
  code: number | null;
  output: string;
  /** It did not end within its deadline, and was killed. */
  timedOut: boolean;
}

/** One of the project's commands (`src/cli/<script>.ts`, as `npm run <script>` runs it) to its end, or killed at `deadlineMs`. */
export function runCommand(
  script: string,
  args: readonly string[],
  env: NodeJS.ProcessEnv,
  deadlineMs: number,
  later: Defer,
): Promise<ClientRun> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', path.join(ROOT, 'src', 'cli', `${script}.ts`), ...args],
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
  }, deadlineMs);
  return new Promise((resolve) => {
    child.once('close', (code) => {
      clearTimeout(deadline);
      resolve({ code, output, timedOut });
    });
  });
}

/** The client's closing line: `N of M document(s) published, ... K failed.` */
function tallyOf(output: string): { published: number; total: number; failed: number } | undefined {
  const match = /(\d+) of (\d+) document\(s\) published,.*?(\d+) failed/.exec(output);
  if (match === null) return undefined;
  return { published: Number(match[1]), total: Number(match[2]), failed: Number(match[3]) };
}

/** The figures a closing note quotes. */
export function figures(stats: ProviderStats, limits: ProviderLimits): string {
  const ratio = stats.limitSeconds === 0 ? 0 : stats.wallSeconds / stats.limitSeconds;
  return (
    `${stats.answered} calls answered, ${stats.refused} refused (429: ${(stats.refused / Math.max(1, stats.answered)).toFixed(3)} per call), ` +
    `${stats.overloaded} overloaded, ${stats.paidTwice.length} keys paid twice; model calls took ` +
    `${stats.wallSeconds.toFixed(1)} s against the limit's own ${stats.limitSeconds.toFixed(1)} s ` +
    `(${ratio.toFixed(2)}x; ${stats.tokens} tokens), ${stats.callsPerMinute.toFixed(0)} calls/min against ${limits.rpm}`
  );
}

/** One run of the pipeline at a provider's limits. */
export interface LimitRun {
  provider: 'openai-compatible' | 'anthropic';
  limits: ProviderLimits;
  /** MODEL_RPM and MODEL_TPM in the workers' environment; otherwise the limits come from the headers alone. */
  configured: boolean;
  workers: number;
  /** One PostgreSQL database (DATABASE_URL) for the workers and the client; otherwise one data folder. */
  databaseUrl?: string | undefined;
  /** How long the client may take before it is killed. */
  deadlineMs: number;
  /** The first this many documents only; all of them (28) by default. */
  documents?: number;
  /** More settings for the workers and the client (BATCH_WINDOW, say). */
  env?: NodeJS.ProcessEnv;
}

/** What a run gave back: the client's run and words, and the provider's own log. */
export interface LimitRunOutcome {
  documents: number;
  client: ClientRun;
  tally: { published: number; total: number; failed: number } | undefined;
  /** The client's `FAILED ...` lines. */
  failures: string[];
  /** `N of M published, K failed`, or what the client ended with instead of a tally. */
  outcome: string;
  stats: ProviderStats;
}

/** A pipeline at a provider's limits, ready: its documents, the provider, and the commands a user runs on it. */
export interface PipelineAtLimits {
  documentsDir: string;
  documents: number;
  provider: LimitedProvider;
  /** Runs `npm run <script> -- <args>` as the client does, with the client's environment. */
  command(script: 'pipeline' | 'budget', args: readonly string[]): Promise<ClientRun>;
  /** Stops the workers. */
  stop(): Promise<void>;
}

/**
 * Starts the pipeline at `run`'s limits, in `dir` (empty), on a dev server and a provider of its own, with its
 * workers polling: `later` gets what closes them.
 */
export async function startAtLimits(run: LimitRun, dir: string, later: Defer): Promise<PipelineAtLimits> {
  const documentsDir = path.join(dir, 'documents');
  fs.mkdirSync(documentsDir);
  const documents = writeDocuments(documentsDir, run.documents);
  // A server of its own: the same documents on one server would be found done by the next run.
  const server = await devServerEnv();
  later(() => server.teardown());
  const { limits, databaseUrl } = run;
  const provider = await startLimitedProvider({ limits, answerDelayMs: ANSWER_DELAY_MS });
  later(() => provider.close());

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
    ...run.env,
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

  const clientEnv = {
    ...shared,
    ...modelSettings('client'),
    ...(databaseUrl === undefined ? {} : { DATA_DIR: path.join(dir, 'client') }),
  };
  return {
    documentsDir,
    documents,
    provider,
    command: (script, args) => runCommand(script, args, clientEnv, run.deadlineMs, later),
    stop: async () => {
      for (const worker of workers) await worker.kill();
    },
  };
}

/** Runs the documents through the pipeline at `run`'s limits (see startAtLimits) and gives back what it did. */
export async function runAtLimits(run: LimitRun, dir: string, later: Defer): Promise<LimitRunOutcome> {
  const { documentsDir, documents, provider, command, stop } = await startAtLimits(run, dir, later);
  const client = await command('pipeline', [documentsDir]);
  await stop();

  const stats = provider.stats();
  const tally = tallyOf(client.output);
  const failures = client.output.split('\n').filter((line) => line.startsWith('FAILED '));
  const outcome =
    tally === undefined
      ? `the client ended with no tally (${client.timedOut ? 'killed at its deadline' : `exit ${client.code}`}), ` +
        `${failures.length} FAILED so far`
      : `${tally.published} of ${documents} published, ${tally.failed} failed`;
  return { documents, client, tally, failures, outcome, stats };
}
