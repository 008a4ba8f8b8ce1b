/**
 * Smoke test of `npm run demo:crash` as a fresh clone runs it: the demo starts its own dev server, model server,
 * publish target and worker processes, SIGKILLs worker 1 partway and starts worker 2. It must exit 0 and print the
 * kill, the timeline, the recovery, one publication per document and no model call for a step already done.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { describe, it } from 'node:test';

const ROOT = path.resolve(__dirname, '..');
const TIMEOUT_MS = 120_000;
const SAMPLE_COUNT = 4;

describe('npm run demo:crash', () => {
  it('kills a worker, recovers, publishes each sample once and repeats no finished model call', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'src/cli/demo-crash.ts')], {
      cwd: ROOT,
      env: process.env,
      stdio: ['ignore', 'pipe', 'pipe'],
      // Its own process group, so a demo that hangs goes together with the dev server and workers it started.
      detached: true,
    });
    let output = '';
    child.stdout.on('data', (c: Buffer) => (output += c.toString('utf8')));
    child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
    const code = await new Promise<number | string | null>((resolve) => {
      const timer = setTimeout(() => {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
        resolve(`no exit within ${TIMEOUT_MS / 1000} s`);
      }, TIMEOUT_MS);
      timer.unref();
      child.once('exit', (exitCode, signal) => {
        clearTimeout(timer);
        resolve(exitCode ?? signal);
      });
    });
    const shown = `demo output:\n${output}`;

    assert.equal(code, 0, shown);
    assert.match(output, /SIGKILL worker 1 \(\d+@/, shown);
    assert.match(output, /^Timeline \(when each step was recorded as done/m, shown);
    assert.match(output, /skipped on resume|rerun as attempt/, shown);
    assert.match(
      output,
      new RegExp(
        `^Publications: ${SAMPLE_COUNT} document\\(s\\), ${SAMPLE_COUNT} revision\\(s\\): one per document, no duplicates`,
        'm',
      ),
      shown,
    );
    assert.match(
      output,
      /^Model calls, counted at the model server by their idempotency-key header: \d+/m,
      shown,
    );
    assert.match(output, /^0 calls for steps already recorded as done/m, shown);
    assert.doesNotMatch(output, /^PROBLEM:/m, shown);
  });
});
