/** docs/add-a-step.md as the tests read it: its patches, and what a copy of the repository makes of them. */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';

const ROOT = path.join(__dirname, '..');
export const GUIDE = path.join(ROOT, 'docs', 'add-a-step.md');
/** The heading the guide's second worked example starts at. */
export const SECOND_EXAMPLE = '## Second worked example';

/** The ```diff blocks of a Markdown text, in order. */
export function diffBlocks(markdown: string): string[] {
  return [...markdown.matchAll(/^```diff\n([\s\S]*?)^```$/gm)].map((m) => m[1] ?? '');
}

/** The files `tsc --noEmit` reports errors in, in the repository at `dir` (relative paths, sorted). */
export function filesWithTypeErrors(dir: string): string[] {
  try {
    execFileSync(
      process.execPath,
      [
        path.join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'),
        '-p',
        'tsconfig.json',
        '--noEmit',
        '--pretty',
        'false',
      ],
      { cwd: dir, stdio: 'pipe', encoding: 'utf8' },
    );
    return [];
  } catch (err) {
    const output = String((err as { stdout?: unknown }).stdout ?? '');
    const files = [...output.matchAll(/^([^\s(][^(]*)\(\d+,\d+\): error TS/gm)].map((m) => m[1] ?? '');
    assert.ok(files.length > 0, `tsc failed without naming a file: ${output}${String(err)}`);
    return [...new Set(files)].sort();
  }
}
