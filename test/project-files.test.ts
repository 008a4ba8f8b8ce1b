/**
 * What a person editing this repository meets around the code: lint and format cover the project's own files and
 * none of the person's (documents kept in `notes/` for `npm start -- notes/` once failed `npm test`); the watch and
 * server commands exist; and "Change a step" in the README names every test that pins what a step returns.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ESLint } from 'eslint';
import * as prettier from 'prettier';
import { z } from 'zod';

const ROOT = path.resolve(__dirname, '..');
const PRETTIER_IGNORE = path.join(ROOT, '.prettierignore');

/** Files git tracks, and new ones it does not ignore. */
function projectFiles(): string[] {
  return execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard'], {
    cwd: ROOT,
    encoding: 'utf8',
  })
    .split('\n')
    .filter((f) => f !== '' && fs.existsSync(path.join(ROOT, f)));
}

const Scripts = z.object({ scripts: z.record(z.string(), z.string()) });

describe('lint and format scope', () => {
  const userFiles = [
    'notes/meeting.md',
    'notes/draft.ts',
    'my documents/report.md',
    'inbox/a.json',
    'todo.md',
  ];

  it('Prettier and ESLint leave documents and folders of your own alone', async () => {
    const eslint = new ESLint({ cwd: ROOT });
    for (const file of userFiles) {
      const info = await prettier.getFileInfo(path.join(ROOT, file), { ignorePath: PRETTIER_IGNORE });
      assert.equal(info.ignored, true, `prettier would check ${file}`);
      assert.equal(await eslint.isPathIgnored(path.join(ROOT, file)), true, `eslint would lint ${file}`);
    }
  });

  it("still cover every one of the project's own sources", async () => {
    const eslint = new ESLint({ cwd: ROOT });
    const skipped = /^(samples\/|test\/histories\/|package-lock\.json$)/;
    for (const file of projectFiles()) {
      if (skipped.test(file)) continue;
      const absolute = path.join(ROOT, file);
      if (/\.(ts|md|json|ya?ml|mjs)$/.test(file)) {
        const info = await prettier.getFileInfo(absolute, { ignorePath: PRETTIER_IGNORE });
        assert.equal(
          info.ignored,
          false,
          `${file} is left out of prettier: add its folder to .prettierignore's list`,
        );
      }
      if (file.endsWith('.ts')) {
        assert.equal(
          await eslint.isPathIgnored(absolute),
          false,
          `${file} is left out of eslint: add its folder to the ignores list of eslint.config.mjs`,
        );
      }
    }
  });
});

describe('npm scripts', () => {
  const { scripts } = Scripts.parse(JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')));

  it('worker:watch and start:watch restart the worker and the main job on a change (workflows included)', () => {
    for (const [name, entry] of [
      ['worker:watch', 'src/cli/worker.ts'],
      ['start:watch', 'src/cli/start.ts'],
    ] as const) {
      const script = scripts[name] ?? '';
      assert.match(script, /^tsx watch /, `${name}: ${script}`);
      assert.ok(script.endsWith(` ${entry}`), `${name} does not run ${entry}: ${script}`);
      assert.match(script, /--include '?workflows\//, `${name} does not watch the workflow code: ${script}`);
      assert.ok(fs.existsSync(path.join(ROOT, entry)));
    }
  });

  it('server runs the embedded server in the foreground', () => {
    assert.equal(scripts.server, 'node --import tsx src/cli/server.ts');
    assert.ok(fs.existsSync(path.join(ROOT, 'src/cli/server.ts')));
  });

  it('runs the entry points that drain on a signal under node itself, not under the tsx command', () => {
    // The tsx command relays a signal to its child and SIGKILLs it when the child has not said, within ~60 ms, that
    // it got the signal: a busy worker was killed mid-call by a deploy's SIGTERM to its group.
    for (const name of ['start', 'worker', 'server', 'pipeline', 'publish-target']) {
      assert.match(
        scripts[name] ?? '',
        /^node --import tsx src\/cli\/[a-z-]+\.ts$/,
        `${name}: ${scripts[name]}`,
      );
    }
  });
});

describe('"Change a step" in the README', () => {
  it('names every test that pins what a step returns', () => {
    const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    const section = /^## Change a step\n([\s\S]*?)^## /m.exec(readme)?.[1];
    assert.ok(section !== undefined, 'no "## Change a step" section');
    const testDir = path.join(ROOT, 'test');
    const pinning = fs
      .readdirSync(testDir)
      .filter((f) => f.endsWith('.test.ts'))
      .filter((f) =>
        /\b(tags\.tags|summary\.summary)\b/.test(fs.readFileSync(path.join(testDir, f), 'utf8')),
      );
    assert.ok(pinning.length > 0);
    for (const file of pinning)
      assert.ok(section.includes(`test/${file}`), `the section does not name test/${file}`);
  });
});

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens. */
function anchorOf(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

/** The anchors a Markdown file's headings make (outside code blocks). */
function anchorsIn(markdown: string): Set<string> {
  const withoutCode = markdown.replace(/^```[\s\S]*?^```$/gm, '');
  return new Set([...withoutCode.matchAll(/^#{1,6} (.+)$/gm)].map((m) => anchorOf(m[1] ?? '')));
}

describe('the README and docs/', () => {
  const README_MAX_LINES = 150;

  it(`keep the README a starter's README: at most ${README_MAX_LINES} lines, details in docs/`, () => {
    const lines = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8').trimEnd().split('\n').length;
    assert.ok(
      lines <= README_MAX_LINES,
      `README.md has ${lines} lines: move the new details to a page in docs/ and link it`,
    );
  });

  it('link only to files and headings that exist', () => {
    const pages = ['README.md', ...fs.readdirSync(path.join(ROOT, 'docs')).map((f) => `docs/${f}`)].filter(
      (f) => f.endsWith('.md'),
    );
    const dead: string[] = [];
    for (const page of pages) {
      const text = fs.readFileSync(path.join(ROOT, page), 'utf8').replace(/^```[\s\S]*?^```$/gm, '');
      for (const [, target = ''] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/.test(target)) continue; // http:, mailto:
        const [file = '', anchor] = target.split('#');
        const resolved = file === '' ? path.join(ROOT, page) : path.resolve(ROOT, path.dirname(page), file);
        if (!fs.existsSync(resolved)) {
          dead.push(`${page}: ${target} (no such file)`);
          continue;
        }
        if (anchor !== undefined && resolved.endsWith('.md')) {
          if (!anchorsIn(fs.readFileSync(resolved, 'utf8')).has(anchor))
            dead.push(`${page}: ${target} (no such heading)`);
        }
      }
    }
    assert.deepEqual(dead, []);
  });
});
