import fs from 'node:fs';
import path from 'node:path';

/** The project's folder: the nearest one above this file with a package.json (the sources, or dist/ in an image). */
function projectRoot(): string {
  let dir = __dirname;
  while (!fs.existsSync(path.join(dir, 'package.json')) && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return dir;
}
const ROOT = projectRoot();

/** Where `npm run build` writes the prebuilt workflow bundle. */
export const WORKFLOW_BUNDLE_PATH = path.join(ROOT, 'dist', 'workflow-bundle.js');
/** What the bundle is made of: the workflows and the workflow-safe modules they import (absent in an image). */
const SOURCE_DIRS = [path.join(ROOT, 'workflows'), path.join(ROOT, 'src')];

/**
 * The prebuilt workflow bundle, when `npm run build` made one that is newer than every source file it could hold;
 * undefined otherwise (none built, or the sources changed since), and the worker bundles from source as in
 * development. A stale bundle is never used: it would run yesterday's workflow code.
 */
export function prebuiltBundle(
  file = WORKFLOW_BUNDLE_PATH,
  sources: readonly string[] = SOURCE_DIRS,
): { codePath: string } | undefined {
  let built: number;
  try {
    built = fs.statSync(file).mtimeMs;
  } catch {
    return undefined;
  }
  return newestSource(sources) <= built ? { codePath: file } : undefined;
}

function newestSource(dirs: readonly string[]): number {
  let newest = 0;
  for (const dir of dirs) {
    if (!fs.existsSync(dir)) continue;
    for (const entry of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
      if (!entry.isFile() || !entry.name.endsWith('.ts')) continue;
      newest = Math.max(newest, fs.statSync(path.join(entry.parentPath, entry.name)).mtimeMs);
    }
  }
  return newest;
}
