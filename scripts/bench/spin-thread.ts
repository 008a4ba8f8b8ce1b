/**
 * The busy yardstick's "model": a thread that does the CPU work asked of it, as the offline model's thread does.
 * It spins until it has been on a core for `ms`, not until `ms` of wall clock have passed: on two shared cores the
 * model's scoring is descheduled whenever the server or the worker's thread takes its core, and finishes that much
 * later; a spin that ended on the wall clock would finish on time however little of it ran, so the yardstick would
 * both finish sooner and burn less CPU than the model it stands for.
 */
import { parentPort } from 'node:worker_threads';
import { serveRequests } from '../../src/lib/thread';

/**
 * A gap between two looks at the clock longer than this is time the thread was off its core (a time slice lost to
 * another thread is a millisecond or more); a look takes well under a microsecond.
 */
const DESCHEDULED_MS = 0.1;

/** Spins until the thread has been on its core for `ms`; `clock` is the wall clock (a test gives its own). */
export function spin({ ms }: { ms: number }, clock: () => number = () => performance.now()): number {
  let onCore = 0;
  let last = clock();
  while (onCore < ms) {
    const now = clock();
    if (now - last < DESCHEDULED_MS) onCore += now - last;
    last = now;
  }
  return ms;
}

if (parentPort !== null) serveRequests(parentPort, spin);
