import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { ensureTemporalExecutable } from './binaries';
import type { Config } from '../config';
import { writePidFile } from './pid-file';
import { serving } from './probes';
import { processRecord } from './processes';
import { devServerArgs } from './tuning';

export interface EmbeddedServer {
  pid: number;
  /** Resolves once the server process has ended, however it ended. */
  exited: Promise<void>;
  /** SIGTERM, then wait until it is gone (SIGKILL after 10 s); removes the pid file. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Runs `temporal server start-dev` on the data folder's database as a child in its own process group that logs to
 * DATA_DIR/temporal-server.log rather than to this process. Its own group: Ctrl-C in the terminal reaches this
 * process only, which stops the worker first and the server last, so nothing is left polling a dead server. Logs to a
 * file: if this process is killed with SIGKILL, the server keeps running on its database file (a pipe to a dead parent
 * would kill it at its next log line), and the next run finds it (the pid file names it) and stops it at its end. Any
 * other way this process exits stops the server with it.
 */
export async function startEmbeddedServer(
  config: Config,
  { log = console.log }: { log?: (line: string) => void } = {},
): Promise<EmbeddedServer> {
  const cli = await ensureTemporalExecutable('cli', config, { log });
  fs.mkdirSync(config.dataDir, { recursive: true });
  const files = config.paths;
  const logFile = files.temporalLog;
  const logFd = fs.openSync(logFile, 'a');
  const child = spawn(
    cli,
    [
      'server',
      'start-dev',
      '--ip',
      '127.0.0.1',
      '--port',
      String(config.embeddedPort),
      '--ui-port',
      String(config.uiPort),
      '--namespace',
      config.temporal.namespace,
      '--db-filename',
      files.temporal,
      '--log-level',
      'warn',
      // Task-queue read rates and the database's write-ahead log: src/temporal/tuning.ts, bench/speed.md.
      ...devServerArgs({ persistent: true }),
    ],
    { stdio: ['ignore', logFd, logFd], detached: true },
  );
  fs.closeSync(logFd);
  const pid = child.pid;
  if (pid === undefined) {
    await new Promise<void>((resolve) => child.once('error', () => resolve()));
    throw new Error(`could not run ${cli}`);
  }
  const owner = processRecord(process.pid);
  await writePidFile(files.temporalPid, pid, owner);
  let gone = false;
  const exited = new Promise<void>((resolve) =>
    child.once('exit', () => {
      gone = true;
      resolve();
    }),
  );
  const untilExit = stopOnExit(pid, files.temporalPid);
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      untilExit.release();
      fs.rmSync(files.temporalPid, { force: true });
      if (gone) return;
      child.kill('SIGTERM');
      const killer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(killer);
    })());
  const address = `127.0.0.1:${config.embeddedPort}`;
  const deadline = Date.now() + 60_000;
  while (!(await serving(address, config.temporal.namespace))) {
    if (gone || Date.now() > deadline) {
      await stop();
      const tail = fs.readFileSync(logFile, 'utf8').split('\n').slice(-15).join('\n');
      throw new Error(`the embedded Temporal server did not start; the end of ${logFile}:\n${tail}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return { pid, exited, stop };
}

/**
 * Sends `pid` a SIGTERM when this process exits while it still runs: after an uncaught error, a config error found
 * once the server was up, `process.exit` anywhere, a closed stdout (`npm start | head`). Only a SIGKILL of this process
 * leaves it running, and then the pid file lets the next run stop it. SIGHUP (the terminal closed) exits too.
 */
export function stopOnExit(pid: number, pidFile: string): { release(): void } {
  const onExit = (): void => {
    fs.rmSync(pidFile, { force: true });
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      // already gone
    }
  };
  const onHangup = (): void => process.exit(129);
  process.once('exit', onExit);
  process.once('SIGHUP', onHangup);
  return {
    release: () => {
      process.off('exit', onExit);
      process.off('SIGHUP', onHangup);
    },
  };
}
