import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { describeExecutable, resolveTemporalExecutable } from './binaries';
import type { Config } from './config';
import { temporalConnection } from './connection';
import type { TemporalConnection } from './connection';

export interface TemporalTarget {
  address: string;
  namespace: string;
  /** TLS / API key settings for a configured cluster; empty for local servers. */
  secure: TemporalConnection['secure'];
  /** The Web UI, when known (the embedded server's, or the default dev server's). */
  uiUrl: string | undefined;
  /** How the server was found, for the first line of output. */
  origin: 'configured' | 'already running' | 'embedded';
  /** Stops the embedded server, if this process started one. Its database file stays. */
  close(): Promise<void>;
}

/**
 * Connects to TEMPORAL_ADDRESS (or the envconfig profile's address, with its TLS and API key) when set.
 * Otherwise uses a server already answering on localhost:7233 (EMBEDDED_TEMPORAL_PORT), or starts an embedded
 * dev server whose database is a file in the data folder, so its histories (the checkpoints) survive a kill of
 * this process and the next run resumes from them.
 */
export async function connectOrStartTemporal(config: Config): Promise<TemporalTarget> {
  const noop = async (): Promise<void> => {};
  const configured = temporalConnection();
  if (configured.address !== undefined) {
    return {
      address: configured.address,
      namespace: configured.namespace ?? config.namespace,
      secure: configured.secure,
      uiUrl: undefined,
      origin: 'configured',
      close: noop,
    };
  }
  const address = `127.0.0.1:${config.embeddedPort}`;
  const defaultUi = `http://localhost:${config.uiPort}`;
  if (await answers('127.0.0.1', config.embeddedPort)) {
    return {
      address,
      namespace: config.namespace,
      secure: {},
      uiUrl: defaultUi,
      origin: 'already running',
      close: noop,
    };
  }
  const executable = resolveTemporalExecutable('cli', config.cliPath);
  fs.mkdirSync(config.dataDir, { recursive: true });
  console.log(`Starting the embedded Temporal dev server (${describeExecutable(executable)})...`);
  const env = await TestWorkflowEnvironment.createLocal({
    server: {
      executable,
      ip: '127.0.0.1',
      port: config.embeddedPort,
      uiPort: config.uiPort,
      namespace: config.namespace,
      dbFilename: path.join(config.dataDir, 'temporal.db'),
    },
  });
  return {
    address: env.address,
    namespace: config.namespace,
    secure: {},
    uiUrl: defaultUi,
    origin: 'embedded',
    close: () => env.teardown(),
  };
}

/** True when something accepts TCP connections on host:port within a short wait. */
export function answers(host: string, port: number, timeoutMs = 500): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port });
    const done = (result: boolean): void => {
      socket.destroy();
      resolve(result);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
  });
}
