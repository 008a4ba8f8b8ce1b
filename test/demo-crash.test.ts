/**
 * The crash walkthrough (docs/crash-demo.md), followed literally: `npm run demo:crash -- --manual` sets up the crash and waits;
 * this test plays the person and runs the `kill -9 <pid>` it prints. The demo must exit 0, publish each sample once,
 * repeat no finished model call, and print what docs/crash-demo.md shows, word for word (times, pids and other numbers
 * may differ; line breaks may fall elsewhere).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';

const ROOT = path.resolve(__dirname, '..');
const TIMEOUT_MS = 120_000;
const SAMPLE_COUNT = 4;

/** The output block of the walkthrough (docs/crash-demo.md): the ```text block after the `--manual` command. */
function readmeOutput(): string {
  const readme = fs.readFileSync(path.join(ROOT, 'docs', 'crash-demo.md'), 'utf8');
  const command = readme.indexOf('npm run demo:crash -- --manual');
  assert.ok(command !== -1, 'docs/crash-demo.md has no `npm run demo:crash -- --manual` walkthrough');
  const block = /^```text\n([\s\S]*?)^```$/m.exec(readme.slice(command));
  assert.ok(block?.[1] !== undefined, 'no ```text block after the walkthrough command');
  return block[1];
}

/** The words that must match: numbers become N, whitespace (and so where lines break) is not compared. */
function words(text: string): string {
  return text
    .replace(/\d+(\.\d+)?/g, 'N')
    .replace(/\s+/g, ' ')
    .trim();
}

describe('npm run demo:crash -- --manual', () => {
  it('waits for the kill, recovers, publishes each sample once, and prints what docs/crash-demo.md shows', async () => {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', path.join(ROOT, 'src/cli/demo-crash.ts'), '--manual'],
      {
        cwd: ROOT,
        env: process.env,
        stdio: ['ignore', 'pipe', 'pipe'],
        // Its own process group, so a demo that hangs goes together with the dev server and workers it started.
        detached: true,
      },
    );
    let output = '';
    let killed: number | undefined;
    child.stdout.on('data', (c: Buffer) => {
      output += c.toString('utf8');
      const pid = /kill -9 (\d+)/.exec(output)?.[1];
      if (pid !== undefined && killed === undefined) {
        killed = Number(pid);
        // A person needs a moment to read the line and type the command.
        setTimeout(() => process.kill(Number(pid), 'SIGKILL'), 1_000);
      }
    });
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
    assert.ok(killed !== undefined, `the demo never said what to kill\n${shown}`);
    assert.match(output, /Worker 1 is gone \(SIGKILL\)/, shown);
    assert.match(
      output,
      new RegExp(
        `^Publications: ${SAMPLE_COUNT} document\\(s\\), ${SAMPLE_COUNT} revision\\(s\\): one per document, no duplicates`,
        'm',
      ),
      shown,
    );
    assert.match(output, /^0 calls for steps already recorded as done/m, shown);
    assert.doesNotMatch(output, /^PROBLEM:/m, shown);
    assert.equal(words(output), words(readmeOutput()), shown);
  });
});
