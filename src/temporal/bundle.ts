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
/** The kit's sources, which the bundle holds with the workflows that import them (absent in an image). */
const KIT_DIR = path.join(ROOT, 'src');

/**
 * What a bundle `npm run bundle` writes starts with: the version of the SDK's workflow runtime inside it. A bundle
 * made before an SDK upgrade holds the old runtime, which the new worker must not load. A comment on the first
 * line, not a line of its own, so the bundle's inline source map still points at the right lines.
 */
export function bundleStamp(version = installedWorkflowSdk()): string {
  return `/* workflow bundle for @temporalio/workflow ${version} */`;
}

function installedWorkflowSdk(): string {
  const parsed: unknown = JSON.parse(
    fs.readFileSync(require.resolve('@temporalio/workflow/package.json'), 'utf8'),
  );
  return typeof parsed === 'object' && parsed !== null && 'version' in parsed ? String(parsed.version) : '?';
}

/**
 * The prebuilt workflow bundle, when `npm run bundle` (or build) made one that is newer than every source file it
 * could hold and carries the installed SDK's stamp; undefined otherwise (none built, the sources changed since,
 * or the SDK was upgraded), and the worker bundles from source as in development. A stale bundle is never used:
 * it would run yesterday's workflow code.
 */
export function prebuiltBundle(
  workflowsPath: string,
  file = WORKFLOW_BUNDLE_PATH,
  sources: readonly string[] = [path.dirname(workflowsPath), KIT_DIR],
  stamp = bundleStamp(),
): { codePath: string } | undefined {
  let built: number;
  try {
    built = fs.statSync(file).mtimeMs;
  } catch {
    return undefined;
  }
  if (!startOf(file, stamp.length).startsWith(stamp)) return undefined;
  return newestSource(sources) <= built ? { codePath: file } : undefined;
}

function startOf(file: string, bytes: number): string {
  const head = Buffer.alloc(bytes);
  const fd = fs.openSync(file, 'r');
  try {
    return head.subarray(0, fs.readSync(fd, head, 0, bytes, 0)).toString('utf8');
  } finally {
    fs.closeSync(fd);
  }
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
