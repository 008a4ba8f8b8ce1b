/**
 * `npm test`'s runner, after the typecheck, lint and bundle: it finds or installs both Temporal binaries the way
 * `npm start` finds the CLI (so a fresh clone needs nothing else), waits briefly for the test PostgreSQL, then runs
 * every test file under node's test runner, and makes sure the run ends:
 *
 * - one deadline for the whole run (TEST_DEADLINE_MINUTES, default 30): past it the files still running are
 *   named, and everything the run started is killed;
 * - every process the run starts carries a marker in its environment, so whatever a test left behind (a worker, a
 *   dev server in a process group of its own) is found and killed when the run ends, however it ends;
 * - temp folders go under one folder of the run's own (TMPDIR), removed on every exit path, and databases a killed
 *   file could not drop (their names carry the run's marker) are dropped.
 */
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadConfig } from '../src/config';
import { runMain, UserFacingError } from '../src/lib/run-main';
import { ensureTemporalExecutable } from '../src/temporal/binaries';
import { ensureOtlpProto } from '../test/otlp-proto';
import { ensurePromtool } from './tools/promtool';
import { onDatabase } from '../test/postgres';

const ROOT = path.resolve(__dirname, '..');
/** The variable that marks this run's processes (and its databases' names); test/postgres.ts reads it too. */
const RUN_MARKER = 'PIPELINE_TEST_RUN';
const CONCURRENCY = 5;
const TEST_TIMEOUT_MS = 10 * 60_000;
/**
 * Files that run after the others, one at a time: their assertions are on times a busy machine would stretch. The
 * chaos test's plan waits for moments (a model call under way, a delivery just made) that five files beside it on
 * two cores starved for minutes in CI; alone, with a core busy elsewhere, a full run takes about 2 minutes.
 */
const ALONE = ['test/chaos.test.ts', 'test/provider-limits-run.test.ts'];

async function run(): Promise<void> {
  const deadlineMinutes = Number(process.env.TEST_DEADLINE_MINUTES ?? '30');
  if (!(deadlineMinutes > 0)) {
    throw new UserFacingError(
      `TEST_DEADLINE_MINUTES must be a positive number of minutes, not "${process.env.TEST_DEADLINE_MINUTES}"`,
    );
  }
  const config = loadConfig();
  const cli = await ensureTemporalExecutable('cli', config);
  const testServer = await ensureTemporalExecutable('test-server', config);
  // For test/metrics-lint.test.ts, which fails saying why when there is none: the other files need no promtool.
  await ensurePromtool({ searchPath: config.searchPath }).catch((err: unknown) =>
    console.error(`npm test: ${String(err)}`),
  );
  await ensureOtlpProto(); // the decoder of test/otlp-receiver.py, into the same .tools/venv
  const databaseUrl = process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  await waitForPostgres(databaseUrl);

  const marker = randomBytes(4).toString('hex');
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `pipeline-tests-${marker}-`));
  const { together, alone } = testFiles(process.argv.slice(2));
  // The runner under way: the files run side by side, then those that must run alone.
  let child: ChildProcess | undefined;
  const runFiles = (files: readonly string[], concurrency: number): Promise<number> => {
    const runner = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        '--test',
        `--test-concurrency=${concurrency}`,
        // A test that sets no timeout of its own fails after this, instead of holding its file until the deadline.
        `--test-timeout=${TEST_TIMEOUT_MS}`,
        // No --test-force-exit: with files run side by side it drops results the files already reported (a tail
        // of a file's tests, nodejs/node#64833: 565 of 572 counted, exit 0). A file that keeps its process alive
        // after its tests meets the run's deadline instead.
        ...files,
      ],
      {
        cwd: ROOT,
        stdio: 'inherit',
        // A group of its own, so one signal reaches the runner and every file it runs.
        detached: true,
        env: {
          // Set by node's runner in its files: a runner started from a test (test/fresh-clone.test.ts) would skip its own.
          ...withoutVariable(process.env, 'NODE_TEST_CONTEXT'),
          TEMPORAL_CLI_PATH: cli,
          TEMPORAL_TEST_SERVER_PATH: testServer,
          TEST_DATABASE_URL: databaseUrl,
          TMPDIR: tmp,
          [RUN_MARKER]: marker,
        },
      },
    );
    child = runner;
    return new Promise<number>((resolve) => {
      runner.once('exit', (code, signal) => resolve(code ?? (signal === null ? 1 : 128)));
    });
  };

  let ending: string | undefined;
  const end = (why: string): void => {
    if (ending !== undefined || child?.pid === undefined) return;
    ending = why;
    const group = child.pid;
    signalGroup(group, 'SIGTERM');
    // A runner that does not stop on SIGTERM gets 10 s, then the whole group is killed.
    setTimeout(() => signalGroup(group, 'SIGKILL'), 10_000).unref();
  };
  const onSignal = (signal: NodeJS.Signals): void => end(`stopped by ${signal}`);
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const deadline = setTimeout(() => {
    const running = child?.pid === undefined ? [] : runningFiles(child.pid, marker);
    console.error(
      `\nnpm test: the run's deadline of ${deadlineMinutes} min passed (TEST_DEADLINE_MINUTES); ` +
        `still running: ${running.length > 0 ? running.join(', ') : 'no test file (the runner itself)'}`,
    );
    end('deadline');
  }, deadlineMinutes * 60_000);

  let code = 0;
  try {
    if (together.length > 0) code = await runFiles(together, CONCURRENCY);
    // Files whose figures are times (a run at a provider's limits against the limit's own time) run after the
    // others, one at a time, so the other files' load is not in their figures.
    if (alone.length > 0 && ending === undefined) code = Math.max(code, await runFiles(alone, 1));
  } finally {
    clearTimeout(deadline);
    const leftovers = await killMarked(marker);
    if (leftovers.length > 0) {
      console.error(
        `npm test: killed ${leftovers.length} process(es) the tests left behind: ${leftovers.join('; ')}`,
      );
    }
    fs.rmSync(tmp, { recursive: true, force: true });
    await dropMarkedDatabases(databaseUrl, marker);
  }
  if (ending !== undefined) {
    console.error(`npm test: ${ending}; the run did not finish`);
    process.exit(1);
  }
  process.exit(code);
}

/** The test files to run (those named, else every test/*.test.ts): side by side, then ALONE's one at a time. */
function testFiles(named: string[]): { together: string[]; alone: string[] } {
  const all =
    named.length > 0
      ? named
      : fs
          .readdirSync(path.join(ROOT, 'test'))
          .filter((name) => name.endsWith('.test.ts'))
          .map((name) => `test/${name}`)
          .sort();
  const alone = all.filter((file) => ALONE.includes(file));
  const together = all.filter((file) => !ALONE.includes(file));
  return { together, alone };
}

/** Waits up to 20 s for PostgreSQL to answer, then says what to do: the store tests need a real one. */
async function waitForPostgres(url: string): Promise<void> {
  let last = '';
  for (let attempt = 0; attempt < 20; attempt++) {
    try {
      await onDatabase(url, (client) => client.query('SELECT 1'));
      return;
    } catch (err) {
      last = err instanceof Error ? err.message : String(err);
      await sleep(1_000);
    }
  }
  const { hostname, port } = new URL(url);
  throw new UserFacingError(
    `PostgreSQL does not answer on ${hostname}:${port || '5432'} (${last}); the store tests need it: start it ` +
      `(a local postgresql service, or docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16), ` +
      `or point TEST_DATABASE_URL at one`,
  );
}

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    // The group is gone already.
  }
}

interface ProcessInfo {
  pid: number;
  ppid: number;
  args: string[];
}

/** The processes whose environment carries this run's marker (Linux's /proc; elsewhere none are found). */
function markedProcesses(marker: string): ProcessInfo[] {
  const found: ProcessInfo[] = [];
  const needle = `${RUN_MARKER}=${marker}`;
  for (const entry of safeList('/proc')) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    try {
      const environ = fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
      if (!environ.includes(needle)) continue;
      const args = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      // The fields after the command's name, which is in parentheses and may hold spaces: state, then ppid.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      found.push({ pid, ppid, args });
    } catch {
      // Gone meanwhile, or not ours to read.
    }
  }
  return found;
}

/** The test files node's runner (`runner`) still has a process for. */
function runningFiles(runner: number, marker: string): string[] {
  return markedProcesses(marker)
    .filter((p) => p.ppid === runner)
    .flatMap((p) => p.args.filter((arg) => arg.endsWith('.test.ts')))
    .map((file) => path.relative(ROOT, path.resolve(ROOT, file)));
}

/** Kills every process still marked with this run (a frozen one is woken so it dies), and says which they were. */
async function killMarked(marker: string): Promise<string[]> {
  const described: string[] = [];
  for (let round = 0; round < 3; round++) {
    const left = markedProcesses(marker);
    if (left.length === 0) break;
    for (const p of left) {
      if (round === 0) described.push(`${p.pid} ${p.args.slice(0, 4).join(' ').slice(0, 160)}`);
      try {
        process.kill(p.pid, 'SIGKILL');
      } catch {
        // Gone already.
      }
    }
    await sleep(200);
  }
  return described;
}

/** Drops the databases test/postgres.ts made for this run that a killed test file could not drop itself. */
async function dropMarkedDatabases(url: string, marker: string): Promise<void> {
  await onDatabase(url, async (client) => {
    const { rows } = await client.query<{ datname: string }>(
      `SELECT datname FROM pg_database WHERE datname LIKE $1`,
      [`pipeline_test_${marker}_%`],
    );
    for (const { datname } of rows) await client.query(`DROP DATABASE IF EXISTS "${datname}" WITH (FORCE)`);
  }).catch((err: unknown) => {
    console.error(`npm test: could not drop this run's leftover databases (${String(err)})`);
  });
}

function withoutVariable(env: NodeJS.ProcessEnv, name: string): NodeJS.ProcessEnv {
  const copy = { ...env };
  delete copy[name];
  return copy;
}

function safeList(dir: string): string[] {
  try {
    return fs.readdirSync(dir);
  } catch {
    return [];
  }
}

runMain(run);
