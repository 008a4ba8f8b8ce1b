import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { Connection } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { z } from 'zod';
import { describeExecutable, resolveTemporalExecutable } from './binaries';
import type { Config, DataPaths } from '../config';
import type { TemporalEndpoint } from './connection';

export interface TemporalTarget extends TemporalEndpoint {
  /** The Web UI, when known (the embedded server's, or the default dev server's). */
  uiUrl: string | undefined;
  /** How the server was found, for the first line of output. */
  origin: 'configured' | 'already running' | 'embedded';
  /** Stops the embedded server, if this process started one. Its database file stays. */
  close(): Promise<void>;
}

/**
 * Connects to TEMPORAL_ADDRESS (or the envconfig profile's address, with its TLS and API key) when set.
 * Otherwise uses a server already answering on localhost:7233 (EMBEDDED_TEMPORAL_PORT), or starts an embedded
 * dev server whose database is a file in the data folder, so its histories (the checkpoints) survive a kill of
 * this process and the next run resumes from them.
 */
export async function connectOrStartTemporal(config: Config): Promise<TemporalTarget> {
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
  const defaultUi = `http://localhost:${config.uiPort}`;
  if (await answers('127.0.0.1', config.embeddedPort)) {
    // Left running by an earlier `npm start` that was killed? Then it is ours to stop at the end of this run.
    const orphan = recordedProcess(config.paths.temporalPid);
    return {
      address,
      namespace: config.temporal.namespace,
      secure: {},
      uiUrl: defaultUi,
      origin: orphan === undefined ? 'already running' : 'embedded',
      close: orphan === undefined ? noop : () => stopProcess(orphan, config.paths.temporalPid),
    };
  }
  const executable = resolveTemporalExecutable('cli', config);
  fs.mkdirSync(config.dataDir, { recursive: true });
  console.log(`Starting the embedded Temporal dev server (${describeExecutable(executable)})...`);
  const server = {
    ip: '127.0.0.1',
    port: config.embeddedPort,
    uiPort: config.uiPort,
    namespace: config.temporal.namespace,
    dbFilename: config.paths.temporal,
  };
  const embedded = {
    address,
    namespace: config.temporal.namespace,
    secure: {},
    uiUrl: defaultUi,
    origin: 'embedded' as const,
  };
  if (executable.type === 'existing-path') {
    return { ...embedded, close: await startDevServer(executable.path, server, config.paths) };
  }
  // No binary here: the SDK downloads the CLI and runs it (its output goes through this process).
  const env = await TestWorkflowEnvironment.createLocal({ server: { executable, ...server } });
  return { ...embedded, close: () => env.teardown() };
}

/**
 * Runs `temporal server start-dev` as a child that logs to DATA_DIR/temporal-server.log rather than to this
 * process: if this process is killed with SIGKILL, the server keeps running on its database file (a pipe to a dead
 * parent would kill it at its next log line), and the next `npm start` finds it answering and carries on.
 * Returns the function that stops it.
 */
async function startDevServer(
  cli: string,
  server: { ip: string; port: number; uiPort: number; namespace: string; dbFilename: string },
  files: Pick<DataPaths, 'temporalLog' | 'temporalPid'>,
): Promise<() => Promise<void>> {
  const logFile = files.temporalLog;
  const log = fs.openSync(logFile, 'a');
  const child = spawn(
    cli,
    [
      'server',
      'start-dev',
      '--ip',
      server.ip,
      '--port',
      String(server.port),
      '--ui-port',
      String(server.uiPort),
      '--namespace',
      server.namespace,
      '--db-filename',
      server.dbFilename,
      '--log-level',
      'warn',
    ],
    { stdio: ['ignore', log, log] },
  );
  fs.closeSync(log);
  if (child.pid !== undefined) writePidFile(files.temporalPid, child.pid);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  let gone = false;
  void exited.then(() => (gone = true));
  const deadline = Date.now() + 60_000;
  while (!(await serving(`${server.ip}:${server.port}`, server.namespace))) {
    if (gone || Date.now() > deadline) {
      child.kill('SIGKILL');
      const tail = fs.readFileSync(logFile, 'utf8').split('\n').slice(-15).join('\n');
      throw new Error(`the embedded Temporal server did not start; the end of ${logFile}:\n${tail}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return async () => {
    fs.rmSync(files.temporalPid, { force: true });
    if (gone) return;
    child.kill('SIGTERM');
    await exited;
  };
}

/**
 * A process as a pid file records it. The ID alone is not enough: the system gives it to another process once this
 * one has ended, so the file also holds what tells the two apart, the start time and the command line.
 */
const ProcessRecordSchema = z.object({
  pid: z.number().int().positive(),
  startTime: z.string(),
  command: z.string(),
});
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
function stillRunning(record: ProcessRecord): boolean {
  const now = processRecord(record.pid);
  return now?.startTime === record.startTime && now.command === record.command;
}

/**
 * Writes the pid file of the embedded server (DATA_DIR/temporal-server.pid) while it runs, so a later run can stop
 * one left behind, and only that one. `spawn` returns once the child has exec'd, so the command read is the server's.
 */
export function writePidFile(file: string, pid: number): void {
  const record = processRecord(pid);
  if (record !== undefined) fs.writeFileSync(file, JSON.stringify(record));
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
async function stopProcess(record: ProcessRecord, file: string): Promise<void> {
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
