/**
 * A step's result is its own, proven by use: docs/add-a-step.md's second worked example changes what tag returns
 * (scored tags, `{ label, score }[]`: its fields, its ask and answer, its offline answer and its column). This
 * test applies that patch to a copy of the repository and shows that it touches activities/tag/ alone, and that
 * the copy type-checks but for the tests that pin tag's output: no kit file, script or workflow fails to compile.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { diffBlocks, filesWithTypeErrors, GUIDE, SECOND_EXAMPLE } from './guide';
import { cleanupAfterAll, copyRepository, scratchDir } from './scratch';

const defer = cleanupAfterAll();
const ROOT = path.join(__dirname, '..');

/** The files `git apply --numstat` says a patch changes. */
function filesOf(patch: string, cwd: string): string[] {
  const numstat = execFileSync('git', ['apply', '--numstat', '-'], { cwd, input: patch, encoding: 'utf8' });
  return numstat
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => line.split('\t')[2] ?? '');
}

describe("changing what tag returns, as docs/add-a-step.md's second example says", () => {
  let copy: string;
  let patches: string[];

  before(() => {
    copy = scratchDir(defer, 'change-a-step-');
    copyRepository(copy);
    const guide = fs.readFileSync(GUIDE, 'utf8');
    const at = guide.indexOf(SECOND_EXAMPLE);
    assert.ok(at >= 0, `docs/add-a-step.md has no "${SECOND_EXAMPLE}"`);
    patches = diffBlocks(guide.slice(at));
    for (const patch of patches) execFileSync('git', ['apply', '-'], { cwd: copy, input: patch });
  });

  it('touches activities/tag/ alone', () => {
    assert.ok(patches.length > 0, 'the second example has no patch');
    const files = patches.flatMap((patch) => filesOf(patch, ROOT));
    assert.ok(files.length > 0);
    assert.deepEqual(
      files.filter((file) => !file.startsWith('activities/tag/')),
      [],
      'files outside activities/tag/ the change touches',
    );
    const tag = fs.readFileSync(path.join(copy, 'activities', 'tag', 'index.ts'), 'utf8');
    assert.match(
      tag,
      /label: z\.string\(\)\.min\(1\)\.max\(60\), score: z\.number\(\)/,
      'the fields are scored tags',
    );
  });

  it('type-checks but for the tests that pin what tag returns', { timeout: 120_000 }, () => {
    const failing = filesWithTypeErrors(copy);
    assert.ok(
      failing.length > 0,
      'no test pins what tag returns: the README\'s "Change a step" list is stale',
    );
    assert.deepEqual(
      failing.filter((file) => !file.startsWith('test/')),
      [],
      'files outside test/ that no longer compile when tag returns scored tags',
    );
  });
});
