import type { Worker } from '@temporalio/worker';
import { SHUTDOWN_GRACE_MS } from './worker';

/** The signals that ask a worker to stop: a deploy's SIGTERM, a terminal's Ctrl-C. */
const STOP_SIGNALS = ['SIGTERM', 'SIGINT'] as const;
/**
 * Signals this soon after the first are the same request delivered again: a signal to the process group reaches
 * node from the kernel and again, relayed, from npm and tsx (~300 ms later, later on a busy machine).
 */
const RELAY_WINDOW_MS = 3_000;

export interface DrainOptions {
  /** Says the worker is stopping, once, at the first signal (which it is given). */
  announce: (line: string, signal: NodeJS.Signals) => void;
  /** Says a later signal was taken as the same request (default: nothing). */
  note?: (line: string) => void;
  /** Whether a person is at a terminal, who may press Ctrl-C again on purpose (default: stdin is a TTY). */
  interactive?: boolean;
  /** Ends the process at once: a person's second Ctrl-C (default: exit 130). */
  now?: () => void;
  /** The time, in ms (tests move it). */
  clock?: () => number;
}

/**
 * Drains `worker` on the first SIGTERM or SIGINT, whichever process of `npm run worker` the signal reaches and
 * however often it is relayed: the steps in flight finish (within SHUTDOWN_GRACE_MS) and are recorded, so the
 * next worker does not pay for them again. The SDK's own hook (off: see installSdkRuntime) took the first signal
 * and left the second to Node's default action, which killed the process mid-call. Only a person at a terminal
 * stops it now, with a second Ctrl-C after the first was acknowledged. Returns a function that removes the
 * listeners (entry points keep them to the end: a relay arriving after removal would kill the process).
 */
export function drainOnSignals(
  worker: Pick<Worker, 'shutdown' | 'getState'>,
  {
    announce,
    note = () => undefined,
    interactive = process.stdin.isTTY === true,
    now = () => process.exit(130),
    clock = Date.now,
  }: DrainOptions,
): () => void {
  let firstAt: number | undefined;
  const onSignal = (signal: NodeJS.Signals): void => {
    const at = clock();
    if (firstAt === undefined) {
      firstAt = at;
      announce(
        `${signal}: stopping once the steps under way finish (up to ${SHUTDOWN_GRACE_MS / 1000} s)` +
          (interactive ? '; Ctrl-C again stops now, and they run again on the next worker' : ''),
        signal,
      );
      if (worker.getState() === 'RUNNING') worker.shutdown();
      return;
    }
    if (interactive && signal === 'SIGINT' && at - firstAt > RELAY_WINDOW_MS) {
      now();
      return;
    }
    note(`${signal} again: already stopping once the steps under way finish`);
  };
  for (const signal of STOP_SIGNALS) process.on(signal, onSignal);
  return () => {
    for (const signal of STOP_SIGNALS) process.off(signal, onSignal);
  };
}
