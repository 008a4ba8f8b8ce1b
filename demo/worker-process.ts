/** Starting and killing real worker processes, for the crash demo and the crash tests. */
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import path from 'node:path';

/** `npm run worker`, the script a worker process runs unless told otherwise. */
export const WORKER_SCRIPT = path.join(__dirname, '..', 'src', 'cli', 'worker.ts');

export interface WorkerProcess {
  child: ChildProcess;
  identity: string;
  /** Everything the process printed, for assertions and for debugging a failed run. */
  output(): string;
  /** Resolves with the exit signal or code once the process is gone. */
  exited: Promise<string>;
  /** SIGKILL: no shutdown, no goodbye to the server, as in a real crash. */
  kill(): Promise<string>;
}

/** Resolves once no process of the group `pgid` is left (polling every 50 ms). */
async function groupGone(pgid: number): Promise<void> {
  for (;;) {
    try {
      process.kill(-pgid, 0);
    } catch {
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * Starts `script` (the real worker by default) under node with tsx and `env` as its whole environment, and
 * waits until it polls: its `Worker <identity> polling` line. Rejects if it exits or stays silent for
 * `readyTimeoutMs`. `viaNpm` starts the documented way instead, `npm run worker` (npm, tsx and node), in a process
 * group of its own, as a terminal or systemd runs it: signal the group with `process.kill(-child.pid)`.
 */
export function startWorkerProcess(
  env: NodeJS.ProcessEnv,
  {
    script = WORKER_SCRIPT,
    readyTimeoutMs = 120_000,
    viaNpm = false,
    wrapper = [],
  }: {
    script?: string;
    readyTimeoutMs?: number;
    viaNpm?: boolean;
    /** A command the worker runs under, e.g. `['ip', 'netns', 'exec', name]` (with `viaNpm`). */
    wrapper?: string[];
  } = {},
): Promise<WorkerProcess> {
  const options = {
    cwd: path.join(__dirname, '..'),
    env,
    stdio: ['ignore', 'pipe', 'pipe'] as ['ignore', 'pipe', 'pipe'],
  };
  const npm = [...wrapper, 'npm', 'run', '--silent', 'worker'];
  const child = viaNpm
    ? spawn(npm[0] ?? 'npm', npm.slice(1), { ...options, detached: true })
    : spawn(process.execPath, ['--import', 'tsx', script], options);
  let output = '';
  const exited = new Promise<string>((resolve) => {
    child.once('exit', (code, signal) => {
      const how = signal ?? `exit ${code ?? '?'}`;
      // npm ends at once on a signal to its group; the worker under it is gone only when the whole group is.
      if (viaNpm && child.pid !== undefined)
        void groupGone(child.pid).then(() => resolve(`npm ${how}, group gone`));
      else resolve(how);
    });
  });
  child.stdout?.on('data', (c: Buffer) => (output += c.toString('utf8')));
  child.stderr?.on('data', (c: Buffer) => (output += c.toString('utf8')));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      // Silence this long is starvation (a machine too busy to load the worker), not a bug in the worker.
      reject(
        new Error(
          `worker process not ready after ${readyTimeoutMs} ms: the machine was starved or the worker hung; ` +
            `what it printed:\n${output || '(nothing)'}`,
        ),
      );
    }, readyTimeoutMs);
    const onData = (): void => {
      const ready = /^Worker (\S+) polling/m.exec(output);
      if (ready?.[1] === undefined) return;
      clearTimeout(timer);
      child.stdout?.off('data', onData);
      resolve({
        child,
        identity: ready[1],
        output: () => output,
        exited,
        kill: () => {
          if (child.exitCode === null && child.signalCode === null) {
            if (viaNpm && child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
            else child.kill('SIGKILL');
          }
          return exited;
        },
      });
    };
    child.stdout?.on('data', onData);
    void exited.then((how) => {
      clearTimeout(timer);
      reject(new Error(`worker process ended (${how}) before it was ready:\n${output}`));
    });
  });
}
