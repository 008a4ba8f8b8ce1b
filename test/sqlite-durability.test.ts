/**
 * What the SQLite stores sync to disk, and from which thread, read off the system calls (strace). A memo claim and
 * a renewal commit without an fsync, since a lost claim costs nothing an OS crash does not already cost
 * (src/model/memo-store.ts says why). A paid answer and a publication are fsynced before their call returns, from
 * one of libuv's threads rather than the main one, so a step reports success only once its result is on disk and
 * the worker's other steps go on meanwhile. A row found that another attempt committed (an answer a twin's claim
 * finds, a receipt a lookup answers) is synced before it is acted on.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { cleanupAfterAll, scratchDir } from './scratch';

const run = promisify(execFile);
const defer = cleanupAfterAll();

/** Per phase of the fixture, its fsync and fdatasync calls, and how many of them the main thread made. */
function syncsByPhase(trace: string): Record<string, { syncs: number; onMainThread: number }> {
  const phases: Record<string, { syncs: number; onMainThread: number }> = {};
  let phase = 'setup';
  let mainThread: string | undefined;
  for (const line of trace.split('\n')) {
    // strace -f starts each line with the thread's id; the markers come from the main thread.
    const thread = /^(\d+)\s/.exec(line)?.[1];
    const marker = /phase-(\w+)/.exec(line);
    if (marker?.[1] !== undefined) {
      phase = marker[1];
      mainThread = thread;
      continue;
    }
    if (!/\b(fsync|fdatasync)\(/.test(line)) continue;
    const counts = (phases[phase] ??= { syncs: 0, onMainThread: 0 });
    counts.syncs += 1;
    if (thread === mainThread) counts.onMainThread += 1;
  }
  return phases;
}

const numbered = (name: string): string[] => Array.from({ length: 10 }, (_, i) => `${name}${i}`);

describe('SQLite durability, read off the system calls', () => {
  it(
    'claims commit unsynced; answers and publications sync off the main thread before their call returns',
    { timeout: 120_000 },
    async () => {
      const dir = scratchDir(defer, 'sqlite-fsyncs-');
      const traceFile = path.join(dir, 'trace.txt');
      await run(
        'strace',
        [
          '-f',
          '-e',
          'trace=fsync,fdatasync,stat,newfstatat,statx,access,faccessat,faccessat2',
          '-o',
          traceFile,
          process.execPath,
          '--import',
          'tsx',
          require.resolve('./fixtures/sqlite-fsyncs'),
          dir,
        ],
        { timeout: 90_000 },
      ).catch((err: unknown) => {
        const message = err instanceof Error ? err.message : String(err);
        throw new Error(
          /ENOENT/.test(message)
            ? "strace is not installed: install Debian's strace package (apt-get install strace) to run this test"
            : `the fixture under strace failed: ${message}`,
        );
      });
      const phases = syncsByPhase(fs.readFileSync(traceFile, 'utf8'));
      const seen = JSON.stringify(phases);
      assert.equal(phases.claims?.syncs ?? 0, 0, `claims fsynced: ${seen}`);
      assert.equal(phases.renewals?.syncs ?? 0, 0, `renewals fsynced: ${seen}`);
      assert.equal(phases.claimsagain?.syncs ?? 0, 0, `claims after a synced write fsynced: ${seen}`);
      assert.ok((phases.release?.syncs ?? 0) >= 1, `a release after unsynced claims did not sync: ${seen}`);
      // One sync of the log in each (an answer's carries the unsynced claims before it too), each before its call
      // returned: the next phase's marker comes after it.
      const durable = [...numbered('answer'), 'answeredclaim', ...numbered('publish'), 'republish', 'lookup'];
      const unsynced = durable.filter((phase) => (phases[phase]?.syncs ?? 0) < 1);
      assert.deepEqual(unsynced, [], `calls that returned before a sync: ${seen}`);
      const onMainThread = durable.filter((phase) => (phases[phase]?.onMainThread ?? 0) > 0);
      assert.deepEqual(onMainThread, [], `calls that synced on the main thread: ${seen}`);
    },
  );
});
