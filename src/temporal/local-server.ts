import { TestWorkflowEnvironment } from '@temporalio/testing';
import { ensureTemporalExecutable } from './binaries';
import type { Config } from '../config';
import { devServerArgs } from './tuning';

export interface LocalDevServerOptions {
  /** A free port is chosen when none is given. */
  port?: number;
  /** The server's SQLite file; in memory when none is given. */
  dbFilename?: string;
  /** The settings every server of the project gets (src/temporal/tuning.ts); false for the server's own defaults. */
  tuned?: boolean;
}

/**
 * A throwaway dev server for the project's own tooling (the tests, `npm run bench`, `npm run record-histories`):
 * the SDK's ephemeral server, from the binary and with the settings `npm start`'s embedded server uses, on
 * 127.0.0.1. The caller tears it down.
 */
export async function startLocalDevServer(
  config: Pick<Config, 'cliPath' | 'testServerPath' | 'searchPath'>,
  { port, dbFilename, tuned = true }: LocalDevServerOptions = {},
): Promise<TestWorkflowEnvironment> {
  const path = await ensureTemporalExecutable('cli', config);
  return TestWorkflowEnvironment.createLocal({
    server: {
      executable: { type: 'existing-path', path },
      ip: '127.0.0.1',
      port,
      dbFilename,
      log: { format: 'pretty', level: 'error' },
      extraArgs: tuned ? devServerArgs({ persistent: dbFilename !== undefined }) : [],
    },
  });
}
