/**
 * Prometheus's `promtool`, which test/metrics-lint.test.ts runs on a worker's metrics page. When none is on PATH or
 * in `.tools/bin`, it comes from Debian's `prometheus` package: `apt-get download` (no root needed) fetches the
 * .deb into a temp folder and only `usr/bin/promtool` is unpacked from it. Nothing is installed system-wide, so no
 * service starts and no dependency is pulled in.
 */
import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { UserFacingError } from '../../src/lib/run-main';
import { findOnPath, TOOLS_DIR } from '../../src/temporal/binaries';

const PACKAGE = 'prometheus';
/** Where Debian's package puts it; the tar member `dpkg-deb --fsys-tarfile` names. */
const MEMBER = './usr/bin/promtool';
/** Each apt-get call (a package list refresh is ~10 MB, the .deb ~20 MB), and the unpacking: none may hang a run. */
const APT_TIMEOUT_MS = 5 * 60_000;
const UNPACK_TIMEOUT_MS = 2 * 60_000;

export interface PromtoolOptions {
  /** The folder whose `bin/` holds the unpacked promtool (default: the project's `.tools`). */
  toolsDir?: string;
  /** Looked through for a promtool first; '' looks nowhere (the tests' way to force an install). */
  searchPath: string;
  /** Where the one line about an install goes. */
  log?: (line: string) => void;
  /**
   * Refresh apt's package lists into a private folder before the download instead of first trying the system's.
   * A fresh machine (a CI container) has none, and `apt-get update` into /var/lib/apt needs root; the fallback
   * does this by itself when the system's lists do not know the package.
   */
  privateLists?: boolean;
}

/** The path of a working promtool: on `searchPath`, else in `toolsDir/bin`, else unpacked there from Debian's package. */
export async function ensurePromtool({
  toolsDir = TOOLS_DIR,
  searchPath,
  log = console.log,
  privateLists = false,
}: PromtoolOptions): Promise<string> {
  const bin = path.join(toolsDir, 'bin');
  const found = findOnPath('promtool', searchPath) ?? findOnPath('promtool', bin);
  if (found !== undefined) return found;

  const target = path.join(bin, 'promtool');
  const manual = `put a promtool on PATH or in ${shown(bin)} (the ${PACKAGE} package of Debian and Ubuntu has one)`;
  log(
    `Installing promtool into ${shown(bin)}: only usr/bin/promtool, unpacked from Debian's ${PACKAGE} package (apt-get download)...`,
  );
  fs.mkdirSync(bin, { recursive: true });
  // Beside the target, so the finished file is renamed into place: a concurrent run never sees half of one.
  const work = fs.mkdtempSync(path.join(toolsDir, '.promtool-'));
  try {
    const deb = await downloadPackage(work, privateLists);
    await unpackMember(deb, work);
    const unpacked = path.join(work, MEMBER);
    await execFileAsync(unpacked, ['--version'], { timeout: 30_000 });
    fs.renameSync(unpacked, target);
    return target;
  } catch (err) {
    throw new UserFacingError(`No promtool, and it could not be installed (${describe(err)}); ${manual}`);
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

/** Downloads the package's .deb into `dir` with the system's package lists, else with fresh ones of its own. */
async function downloadPackage(dir: string, privateLists: boolean): Promise<string> {
  let systemError: string | undefined;
  if (!privateLists) {
    try {
      await execFileAsync('apt-get', ['-q', 'download', PACKAGE], { cwd: dir, timeout: APT_TIMEOUT_MS });
      return onlyDeb(dir);
    } catch (err) {
      if (isMissingCommand(err)) throw err;
      systemError = describe(err);
    }
  }
  // apt keeps its lists, their lock and its package cache where Dir::State::Lists and Dir::Cache say, so an
  // update into a folder of our own needs no root and leaves the system's untouched.
  const lists = path.join(dir, 'apt-lists');
  const cache = path.join(dir, 'apt-cache');
  for (const sub of [path.join(lists, 'partial'), path.join(cache, 'archives', 'partial')]) {
    fs.mkdirSync(sub, { recursive: true });
  }
  const own = ['-q', '-o', `Dir::State::Lists=${lists}`, '-o', `Dir::Cache=${cache}`];
  try {
    await execFileAsync('apt-get', [...own, 'update'], { cwd: dir, timeout: APT_TIMEOUT_MS });
    await execFileAsync('apt-get', [...own, 'download', PACKAGE], { cwd: dir, timeout: APT_TIMEOUT_MS });
  } catch (err) {
    const before = systemError === undefined ? '' : `with the system's package lists: ${systemError}; `;
    throw new Error(`${before}with fresh ones: ${describe(err)}`);
  }
  return onlyDeb(dir);
}

function onlyDeb(dir: string): string {
  const debs = fs.readdirSync(dir).filter((name) => name.startsWith(`${PACKAGE}_`) && name.endsWith('.deb'));
  const [deb] = debs;
  if (deb === undefined || debs.length > 1) {
    throw new Error(`apt-get download left ${debs.length} ${PACKAGE} .deb files in ${dir}`);
  }
  return path.join(dir, deb);
}

/** `dpkg-deb --fsys-tarfile deb | tar -x MEMBER`, in `dir`: the package's files stay packed but this one. */
async function unpackMember(deb: string, dir: string): Promise<void> {
  const dpkg = spawn('dpkg-deb', ['--fsys-tarfile', deb], {
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: UNPACK_TIMEOUT_MS,
  });
  const tar = spawn('tar', ['-x', '-f', '-', MEMBER], {
    cwd: dir,
    stdio: ['pipe', 'ignore', 'pipe'],
    timeout: UNPACK_TIMEOUT_MS,
  });
  dpkg.stdout.pipe(tar.stdin);
  // A tar that stops reading early (it failed) must not leave dpkg-deb blocked on a full pipe or crash us on EPIPE.
  tar.stdin.on('error', () => dpkg.kill());
  await Promise.all([finished(dpkg, 'dpkg-deb'), finished(tar, 'tar')]);
}

function finished(child: ReturnType<typeof spawn>, name: string): Promise<void> {
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  return new Promise((resolve, reject) => {
    child.once('error', (err) => reject(new Error(`${name}: ${err.message}`)));
    child.once('close', (code, signal) =>
      code === 0
        ? resolve()
        : reject(new Error(`${name} exited with ${code ?? signal}: ${stderr.trim().slice(-300)}`)),
    );
  });
}

const execFileAsync = promisify(execFile);

/** An error on one line: a failed command's last lines of stderr, else its message. */
function describe(err: unknown): string {
  if (isMissingCommand(err)) return `this machine has no ${err.path}`;
  const stderr =
    typeof err === 'object' && err !== null && 'stderr' in err && typeof err.stderr === 'string'
      ? err.stderr.trim()
      : '';
  const text = stderr !== '' ? stderr : err instanceof Error ? err.message : String(err);
  return text.split('\n').slice(-3).join(' / ').slice(0, 500);
}

function isMissingCommand(err: unknown): err is { path: string } {
  return (
    typeof err === 'object' &&
    err !== null &&
    'code' in err &&
    err.code === 'ENOENT' &&
    'path' in err &&
    typeof err.path === 'string'
  );
}

function shown(file: string): string {
  return path.relative(process.cwd(), file) || file;
}

/**
 * Runs promtool with `args` (in `cwd`, with `stdin` as its input where given), killed after 30 s: its exit code and
 * what it printed, stdout and stderr together.
 */
export function runPromtool(
  tool: string,
  args: string[],
  { cwd, stdin }: { cwd?: string; stdin?: string } = {},
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(tool, args, { cwd, stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
    child.stdin.end(stdin ?? '');
  });
}
