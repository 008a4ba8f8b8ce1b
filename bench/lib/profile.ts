/**
 * The worker's main thread (its event loop, where the SDK, the stores and the activities run) over a pass of the
 * pipeline, from the inspector's sampling profiler, in a few buckets: where the project's own code stands beside
 * the SDK's. Self time, attributed by the file each sampled function is in (a native call such as better-sqlite3's
 * statement counts for the JavaScript that made it). The offline model's scoring is on a thread of its own and not
 * in it; what is left of the model here is its text handling on this thread (markdown titles).
 */
import { Session } from 'node:inspector/promises';
import { round } from './rows';

/** A bucket for a sampled function's file (or the profiler's name for it). */
function bucketOf(url: string, functionName: string): string {
  if (functionName === '(idle)') return 'idle';
  // Profiler.stop's own work, sampled as it gathers the profile: not the run's.
  if (url === 'node:inspector') return 'the profiler itself';
  if (functionName === '(garbage collector)') return 'garbage collection';
  if (functionName === '(program)' || functionName === '(root)') return 'V8 and native, unattributed';
  if (/node_modules\/(wink-|marked)|src\/model\/(offline-nlp|markdown)\.ts/.test(url))
    return 'model (offline)';
  if (/src\/store\/|node_modules\/(better-sqlite3|kysely)\//.test(url)) return 'stores (SQLite)';
  if (/node_modules\/zod\//.test(url)) return 'validation (zod)';
  if (/node_modules\/(pino|@opentelemetry)/.test(url)) return 'logging and telemetry';
  if (/node_modules\/(@temporalio|protobufjs|long|rxjs|@grpc)/.test(url)) return 'Temporal SDK';
  if (/^node:/.test(url)) return 'Node (timers, streams, fs, crypto)';
  if (/\/(src|activities|workflows)\//.test(url)) return 'project code';
  return 'other';
}

interface ProfileNode {
  id: number;
  callFrame: { url: string; functionName: string };
  children?: number[];
}

/** The profiler's own entries, which have no caller to stand for them. */
const OWN_ENTRIES = new Set(['(idle)', '(garbage collector)', '(program)', '(root)']);

/** Runs `work` under the profiler; returns its result and the milliseconds of CPU each bucket took. */
export async function profiled<T>(
  work: () => Promise<T>,
): Promise<{ result: T; msByBucket: Record<string, number> }> {
  const session = new Session();
  session.connect();
  try {
    await session.post('Profiler.enable');
    await session.post('Profiler.setSamplingInterval', { interval: 200 });
    await session.post('Profiler.start');
    const result = await work();
    const { profile } = await session.post('Profiler.stop');
    const nodes = new Map<number, ProfileNode>(profile.nodes.map((n) => [n.id, n]));
    const parents = new Map<number, number>();
    for (const node of profile.nodes) for (const child of node.children ?? []) parents.set(child, node.id);
    const bucketOfNode = (id: number): string => {
      for (let at: number | undefined = id; at !== undefined; at = parents.get(at)) {
        const frame = nodes.get(at)?.callFrame;
        if (frame === undefined) break;
        if (frame.url !== '' || (at === id && OWN_ENTRIES.has(frame.functionName)))
          return bucketOf(frame.url, frame.functionName);
      }
      return 'other';
    };
    const ms: Record<string, number> = {};
    const samples = profile.samples ?? [];
    const deltas = profile.timeDeltas ?? [];
    for (const [i, id] of samples.entries()) {
      const bucket = bucketOfNode(id);
      ms[bucket] = (ms[bucket] ?? 0) + (deltas[i] ?? 0) / 1000;
    }
    for (const key of Object.keys(ms)) ms[key] = round(ms[key] ?? 0, 1);
    return { result, msByBucket: ms };
  } finally {
    session.disconnect();
  }
}
