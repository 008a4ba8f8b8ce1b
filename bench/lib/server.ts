import fs from 'node:fs';
import path from 'node:path';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig } from '../../src/config';
import { freeLoopbackPort } from '../../src/lib/loopback';
import { startLocalDevServer } from '../../src/temporal/local-server';
import { listenerOn } from '../../src/temporal/processes';

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
  const env = await startLocalDevServer(loadConfig(), { port, dbFilename, tuned });
  return { env, address: `127.0.0.1:${port}`, dir, pid: listenerOn(port)?.pid };
}
