import fs from 'node:fs';
import path from 'node:path';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig } from '../../src/config';
import { freeLoopbackPort } from '../../src/lib/loopback';
import { ensureTemporalExecutable } from '../../src/temporal/binaries';
import { listenerOn } from '../../src/temporal/processes';
import { devServerArgs } from '../../src/temporal/tuning';

/** A file-backed dev server of the benchmark's, in its own folder. */
export interface Server {
  env: TestWorkflowEnvironment;
  address: string;
  dir: string;
  pid: number | undefined;
}

/** A dev server on a free port with its database in a new folder under `root`: with the server's defaults, or tuned. */
export async function startServer(root: string, label: string, tuned: boolean): Promise<Server> {
  const dir = fs.mkdtempSync(path.join(root, `${label}-`));
  const port = await freeLoopbackPort();
  const dbFilename = path.join(dir, 'temporal.db');
  const env = await TestWorkflowEnvironment.createLocal({
    server: {
      executable: { type: 'existing-path', path: await ensureTemporalExecutable('cli', loadConfig()) },
      ip: '127.0.0.1',
      port,
      dbFilename,
      log: { format: 'pretty', level: 'error' },
      extraArgs: tuned ? devServerArgs({ persistent: true }) : [],
    },
  });
  return { env, address: `127.0.0.1:${port}`, dir, pid: listenerOn(port)?.pid };
}
