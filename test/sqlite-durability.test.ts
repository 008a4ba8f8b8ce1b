/**
 * What a SQLite memo syncs to disk, read off the system calls (strace): a claim and a renewal commit without an
 * fsync, since a lost claim costs nothing an OS crash does not already cost (src/model/memo-store.ts says why);
 * a paid answer is fsynced before complete() returns, so the step reports success only once it is on disk.
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

/** The fsync and fdatasync calls between the fixture's phase markers, per phase. */
function syncsByPhase(trace: string): Record<string, number> {
  const counts: Record<string, number> = {};
  let phase = 'setup';
  for (const line of trace.split('\n')) {
    const marker = /phase-(\w+)/.exec(line);
    if (marker?.[1] !== undefined) {
      phase = marker[1];
      continue;
    }
    if (/\b(fsync|fdatasync)\(/.test(line)) counts[phase] = (counts[phase] ?? 0) + 1;
  }
  return counts;
}

describe('SQLite memo durability, read off the system calls', () => {
  it(
    'claims and renewals commit unsynced; every answer is fsynced before its complete() returns',
    { timeout: 120_000 },
    async () => {
      const dir = scratchDir(defer, 'memo-fsyncs-');
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
          require.resolve('./fixtures/memo-fsyncs'),
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
      const counts = syncsByPhase(fs.readFileSync(traceFile, 'utf8'));
      assert.equal(counts.claims ?? 0, 0, `claims fsynced: ${JSON.stringify(counts)}`);
      assert.equal(counts.renewals ?? 0, 0, `renewals fsynced: ${JSON.stringify(counts)}`);
      // One sync of the log per answer at least (it carries the unsynced claims before it too), each before its
      // complete() returned: the next answer's marker comes after it.
      const unsynced = Array.from({ length: 10 }, (_, i) => `answer${i}`).filter((p) => (counts[p] ?? 0) < 1);
      assert.deepEqual(
        unsynced,
        [],
        `answers whose complete() returned before a sync: ${JSON.stringify(counts)}`,
      );
    },
  );
});
