/** The busy yardstick's "model": a thread that holds a core for the time asked, as the offline model's thread does. */
import { parentPort } from 'node:worker_threads';
import { serveRequests } from '../../src/lib/thread';

export function spin({ ms }: { ms: number }): number {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // Spinning: CPU on the thread, as the model's scoring is, while the worker's event loop goes on.
  }
  return ms;
}

if (parentPort !== null) serveRequests(parentPort, spin);
