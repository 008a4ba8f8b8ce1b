/**
 * What every test file needs and nothing heavy: the cleanup registry that closes and removes what a file's tests
 * made, temp folders and free ports. Apart from test/helpers.ts (the Temporal SDK, the model, the stores), so a
 * file that needs only these does not spend a second of CPU loading those.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after } from 'node:test';
import { freeLoopbackPort } from '../src/lib/loopback';

/** Closes or removes something a test made. */
export type Cleanup = () => Promise<void> | void;
/** Registers a cleanup to run after the file's tests. */
export type Defer = (cleanup: Cleanup) => void;

/**
 * A cleanup registry for this test file: returns `defer(cleanup)`, and runs what was deferred in node:test's
 * `after` hook, last registered first (a folder is removed after the store inside it is closed). Call once, at
 * the top level of the file.
 */
export function cleanupAfterAll(): Defer {
  const cleanups: Cleanup[] = [];
  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup();
  });
  return (cleanup) => {
    cleanups.push(cleanup);
  };
}

/** A fresh, empty temp folder, removed after the file's tests. */
export function scratchDir(defer: Defer, prefix?: string): string {
  const dir = tempDir(prefix);
  defer(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A fresh temp folder, removed by the caller's `cleanup`. */
export function tempDir(prefix = 'pipeline-test-'): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/** A TCP port that was free a moment ago on loopback (the OS picks it; the caller binds it soon after). */
export const freePort = freeLoopbackPort;

const ROOT = path.resolve(__dirname, '..');

/** A copy of the working tree (tracked files and new ones git does not ignore) in `dir`, sharing this checkout's node_modules. */
export function copyRepository(dir: string): void {
  const files = execFileSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], {
    cwd: ROOT,
    encoding: 'utf8',
  })
    .split('\0')
    .filter((f) => f !== '' && fs.existsSync(path.join(ROOT, f)));
  for (const file of files) {
    fs.mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
    fs.copyFileSync(path.join(ROOT, file), path.join(dir, file));
  }
  fs.symlinkSync(path.join(ROOT, 'node_modules'), path.join(dir, 'node_modules'));
}
