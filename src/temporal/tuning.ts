import { REVIEW_STATUS } from '../contract/review';

/**
 * What every Temporal dev server this project starts (the embedded one, `npm run server`, the tests' and the
 * benchmark's) is told on top of its address, database and namespace. Measured by `npm run bench`; bench/speed.md has
 * the figures.
 *
 * The history service reads its transfer queue (new workflow and activity tasks) and its timer queue (retries,
 * timeouts, sleeps) at most `...MaxPollRPS` times a second per shard; the default is 20, and a dev server has one
 * shard, so back-to-back workflow tasks wait ~50 ms for the next read. Clusters with many shards rarely meet the
 * limit; a single-shard server meets it at every step.
 */
export const DYNAMIC_CONFIG: Readonly<Record<string, string | boolean | number>> = {
  'history.transferProcessorMaxPollRPS': 1000,
  'history.timerProcessorMaxPollRPS': 1000,
  // Both are on by default in recent servers; said here so that a server that differs is not silently slower.
  'system.enableEagerWorkflowStart': true,
  'system.enableActivityEagerExecution': true,
};

/**
 * SQLite settings of a file-backed dev server (the embedded one): write-ahead log with `synchronous=NORMAL`
 * commits without an fsync per transaction. It survives a kill of the server process (the log is in the OS's
 * cache); an OS crash or power cut can lose the last commits. Steps finished just before such a crash run again
 * (under the same idempotency keys, and the memo answers the paid model calls).
 */
export const SQLITE_PRAGMAS: Readonly<Record<string, string>> = {
  journal_mode: 'wal',
  synchronous: 'normal',
};

/**
 * The flags for `temporal server start-dev`: the dynamic config, the review's search attribute, and the pragmas when
 * it has a database file.
 */
export function devServerArgs({ persistent }: { persistent: boolean }): string[] {
  const args = Object.entries(DYNAMIC_CONFIG).flatMap(([key, value]) => [
    '--dynamic-config-value',
    `${key}=${JSON.stringify(value)}`,
  ]);
  // The search attribute a reviewer's queue is listed by (src/contract/review.ts).
  args.push('--search-attribute', `${REVIEW_STATUS.name}=Keyword`);
  if (persistent) {
    for (const [pragma, value] of Object.entries(SQLITE_PRAGMAS))
      args.push('--sqlite-pragma', `${pragma}=${value}`);
  }
  return args;
}
