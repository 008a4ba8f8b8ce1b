/**
 * The benchmark's timing of the offline model: its scoring on a thread of its own, as the model's thread runs it,
 * answered with how long the scoring took there (no message in it, no garbage left on the main thread).
 */
import { parentPort } from 'node:worker_threads';
import { serveRequests } from '../../src/lib/thread';
import { score } from '../../src/model/offline-nlp';
import type { OfflineRequest } from '../../src/model/offline-nlp';

export function scoringMs(request: OfflineRequest): number {
  const started = performance.now();
  score(request);
  return performance.now() - started;
}

if (parentPort !== null) serveRequests(parentPort, scoringMs);
