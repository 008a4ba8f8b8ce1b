import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Connection } from '@temporalio/client';
import { z } from 'zod';
import { ensureTemporalExecutable } from './binaries';
import { ConfigError } from '../config';
import type { Config } from '../config';
import type { TemporalEndpoint } from './connection';
import { devServerArgs } from './tuning';

export interface TemporalTarget extends TemporalEndpoint {
  /** The Web UI, when known (the embedded server's, or the default dev server's). */
  uiUrl: string | undefined;
  /** How the server was found, for the first line of output. */
  origin: 'configured' | 'already running' | 'embedded';
  /** Stops the embedded server, if this process started one. Its database file stays. */
  close(): Promise<void>;
}

type Log = (line: string) => void;

/**
 * Connects to TEMPORAL_ADDRESS (or the envconfig profile's address, with its TLS and API key) when set.
 * Otherwise uses a server already answering on localhost:7233 (EMBEDDED_TEMPORAL_PORT), such as `npm run server`,
 * or starts an embedded dev server whose database is a file in the data folder, so its histories (the checkpoints)
 * survive a kill of this process and the next run resumes from them.
 */
export async function connectOrStartTemporal(
  config: Config,
  { log = console.log }: { log?: Log } = {},
): Promise<TemporalTarget> {
  const noop = async (): Promise<void> => {};
  const configured = config.temporal;
  if (configured.address !== undefined) {
    return {
      address: configured.address,
      namespace: configured.namespace,
      secure: configured.secure,
      uiUrl: undefined,
      origin: 'configured',
      close: noop,
    };
  }
  const address = `127.0.0.1:${config.embeddedPort}`;
  const found = { address, namespace: config.temporal.namespace, secure: {}, uiUrl: uiOrigin(config) };
  if (await answers('127.0.0.1', config.embeddedPort)) {
    const recorded = recordedProcess(config.paths.temporalPid);
    if (recorded !== undefined && !ownerAlive(recorded)) {
      // Left running by an earlier `npm start` that was killed: it is ours now, to stop at the end of this run.
      await writePidFile(config.paths.temporalPid, recorded.pid, processRecord(process.pid));
      const untilExit = stopOnExit(recorded.pid, config.paths.temporalPid);
      const close = async (): Promise<void> => {
        untilExit.release();
        await stopProcess(recorded, config.paths.temporalPid);
      };
      return { ...found, origin: 'embedded', close };
    }
    if (recorded === undefined) checkUnrecordedServer(config, log);
    return { ...found, origin: 'already running', close: noop };
  }
  const server = await startEmbeddedServer(config, { log });
  return { ...found, origin: 'embedded', close: server.stop };
}

/** The embedded server's Web UI origin. */
export function uiOrigin(config: Pick<Config, 'uiPort'>): string {
  return `http://localhost:${config.uiPort}`;
}

/**
 * The last line of `npm start`: the Web UI's link while something serves it (checked now, after the run), otherwise
 * how to get one. Undefined for a configured server, whose UI this project does not know.
 */
export async function webUiLine(
  target: TemporalTarget,
  config: Pick<Config, 'uiPort'>,
): Promise<string | undefined> {
  if (target.uiUrl === undefined) return undefined;
  if (await uiAnswers(config.uiPort))
    return `Web UI: ${target.uiUrl}/namespaces/${target.namespace}/workflows`;
  return 'Web UI: none now (the embedded server stopped with this run); `npm run server` serves these runs in one.';
}

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
  { log = console.log }: { log?: Log } = {},
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
      // Task-queue read rates and the database's write-ahead log: src/temporal/tuning.ts, README.md "Speed".
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
function stopOnExit(pid: number, pidFile: string): { release(): void } {
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

/**
 * Something answers on the embedded port and no pid file names it: say which process it is and how to stop it. A
 * dev server on this data folder's database whose file is gone (the data folder was removed under it) cannot serve
 * this run: refuse, with the command that stops it.
 */
function checkUnrecordedServer(config: Config, log: Log): void {
  const port = config.embeddedPort;
  const listener = listenerOn(port);
  const who =
    listener === undefined
      ? `a process this user cannot see (find it with \`ss -ltnp 'sport = :${port}'\`)`
      : `pid ${listener.pid}: ${listener.command}`;
  const stopIt = listener === undefined ? `stop that process` : `stop it with \`kill ${listener.pid}\``;
  const ourDatabase = listener?.command.includes(` --db-filename ${config.paths.temporal}`) ?? false;
  if (ourDatabase && !fs.existsSync(config.paths.temporal)) {
    throw new ConfigError(
      `a Temporal server left behind by an earlier run answers on 127.0.0.1:${port} (${who}), but its database ` +
        `${config.paths.temporal} is gone (was the data folder removed?): ${stopIt}, then run this again`,
    );
  }
  log(
    `Using the Temporal server that answers on 127.0.0.1:${port} (${who}); ${stopIt} when you are done with it.`,
  );
}

/**
 * The process listening on TCP `port` (any address), read from /proc: the socket's inode in /proc/net/tcp{,6}, then
 * the process holding a descriptor to it. Undefined off Linux, or when the process belongs to another user.
 */
export function listenerOn(port: number): { pid: number; command: string } | undefined {
  if (process.platform !== 'linux') return undefined;
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  const inodes = new Set<string>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = fs.readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      const local = fields[1];
      // State 0A is LISTEN; field 10 is the socket's inode.
      if (local?.endsWith(`:${hexPort}`) && fields[3] === '0A' && fields[9] !== undefined)
        inodes.add(fields[9]);
    }
  }
  if (inodes.size === 0) return undefined;
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let fds: string[];
    try {
      fds = fs.readdirSync(path.join('/proc', entry, 'fd'));
    } catch {
      continue;
    }
    for (const fd of fds) {
      let target: string;
      try {
        target = fs.readlinkSync(path.join('/proc', entry, 'fd', fd));
      } catch {
        continue;
      }
      const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
      if (inode !== undefined && inodes.has(inode)) {
        const pid = Number(entry);
        return { pid, command: processRecord(pid)?.command ?? '?' };
      }
    }
  }
  return undefined;
}

/**
 * A process as a pid file records it. The ID alone is not enough: the system gives it to another process once this
 * one has ended, so the file also holds what tells the two apart, the start time and the command line. `owner` is
 * the process that started the server (`npm start`, `npm run server`): while it lives the server is in use, once it
 * is gone the server was left behind.
 */
const BareRecordSchema = z.object({
  pid: z.number().int().positive(),
  startTime: z.string(),
  command: z.string(),
});
const ProcessRecordSchema = BareRecordSchema.extend({ owner: BareRecordSchema.optional() });
export type ProcessRecord = z.infer<typeof ProcessRecordSchema>;

/**
 * The record of the live process `pid`, read from /proc: its start time (field 22 of /proc/<pid>/stat, clock ticks
 * since boot) and its command line. Undefined when it is gone, a zombie, or the system has no /proc (then no pid
 * file is written or trusted, and a server left behind is used but not stopped).
 */
export function processRecord(pid: number): ProcessRecord | undefined {
  if (process.platform !== 'linux') return undefined;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Field 2 is the command name in parentheses, which may hold spaces and ')': count from the last ')'.
    const startTime = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[22 - 3];
    const command = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0$/, '').replaceAll('\0', ' ');
    return startTime !== undefined && command !== '' ? { pid, startTime, command } : undefined;
  } catch {
    return undefined;
  }
}

/** True while `record` names a live process that is still the one recorded. */
function stillRunning(record: Omit<ProcessRecord, 'owner'>): boolean {
  const now = processRecord(record.pid);
  return now?.startTime === record.startTime && now.command === record.command;
}

/** True while the process that started the recorded server is alive (a record without an owner has none). */
export function ownerAlive(record: ProcessRecord): boolean {
  return record.owner !== undefined && stillRunning(record.owner);
}

/**
 * Writes the pid file of the embedded server (DATA_DIR/temporal-server.pid) while it runs, so a later run can stop
 * one left behind, and only that one. Nothing is written for a process that is gone.
 */
export async function writePidFile(file: string, pid: number, owner?: ProcessRecord): Promise<void> {
  const record = await execedProcessRecord(pid);
  if (record === undefined) return;
  const { pid: ownerPid, startTime, command } = owner ?? {};
  const withOwner =
    ownerPid !== undefined && startTime !== undefined && command !== undefined
      ? { ...record, owner: { pid: ownerPid, startTime, command } }
      : record;
  fs.writeFileSync(file, JSON.stringify(withOwner));
}

/**
 * The record of a process just spawned. `spawn` returns when the child's exec has closed its inherited descriptors,
 * a moment before the kernel fills in the new program's command line: read then, /proc shows an empty one. Waits
 * (up to `waitMs`) for it while the process lives; undefined once it is gone.
 */
export async function execedProcessRecord(
  pid: number,
  {
    waitMs = 2_000,
    read = processRecord,
  }: { waitMs?: number; read?: (pid: number) => ProcessRecord | undefined } = {},
): Promise<ProcessRecord | undefined> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const record = read(pid);
    if (record !== undefined || !fs.existsSync(`/proc/${pid}`) || Date.now() > deadline) return record;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/**
 * The embedded server recorded in `file`, if that very process is still alive: same ID, start time and command.
 * A file that names another process (its ID reused), a dead one, or is in the old format (a bare ID) is removed,
 * and undefined returned: nothing is ever signalled on its word.
 */
export function recordedProcess(file: string): ProcessRecord | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch {
    parsed = undefined;
  }
  const record = ProcessRecordSchema.safeParse(parsed);
  if (record.success && stillRunning(record.data)) return record.data;
  fs.rmSync(file, { force: true });
  return undefined;
}

/**
 * SIGTERM, then wait (up to 10 s) until the process is gone; removes its pid file. Checked again just before the
 * signal: the run may have lasted hours, long enough for the server to end and its ID to go to another process.
 */
export async function stopProcess(record: ProcessRecord, file: string): Promise<void> {
  fs.rmSync(file, { force: true });
  if (!stillRunning(record)) return;
  try {
    process.kill(record.pid, 'SIGTERM');
  } catch {
    return;
  }
  for (let waited = 0; waited < 10_000 && stillRunning(record); waited += 100) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** True once the server answers gRPC and knows the namespace. */
async function serving(address: string, namespace: string): Promise<boolean> {
  const [host, port] = address.split(':');
  if (host === undefined || !(await answers(host, Number(port)))) return false;
  let connection: Connection | undefined;
  try {
    connection = await Connection.connect({ address, connectTimeout: 1_000 });
    await connection.workflowService.describeNamespace({ namespace });
    return true;
  } catch {
    return false;
  } finally {
    await connection?.close();
  }
}

/** True when something accepts TCP connections on host:port within a short wait. */
/**
 * True when the Temporal Web UI answers on this loopback port: its settings API, not just any listener (a port
 * freed by a server that stopped may be taken by another program a moment later).
 */
async function uiAnswers(port: number, timeoutMs = 1_000): Promise<boolean> {
  try {
    const response = await fetch(`http://127.0.0.1:${port}/api/v1/settings`, {
      signal: AbortSignal.timeout(timeoutMs),
      redirect: 'manual',
    });
    await response.arrayBuffer();
    return response.ok && (response.headers.get('content-type') ?? '').includes('application/json');
  } catch {
    return false;
  }
}

export function answers(host: string, port: number, timeoutMs = 500): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port });
    const done = (result: boolean): void => {
      socket.destroy();
      resolve(result);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
  });
}
