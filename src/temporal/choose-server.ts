import fs from 'node:fs';
import { ConfigError } from '../config';
import type { Config } from '../config';
import type { TemporalEndpoint } from './connection';
import { startEmbeddedServer, stopOnExit } from './embedded-server';
import { ownerAlive, recordedProcess, stopProcess, writePidFile } from './pid-file';
import { answers, uiAnswers } from './probes';
import { listenerOn, processRecord } from './processes';

export interface TemporalTarget extends TemporalEndpoint {
  /** The Web UI, when known (the embedded server's, or the default dev server's). */
  uiUrl: string | undefined;
  /** How the server was found, for the first line of output. */
  origin: 'configured' | 'already running' | 'embedded';
  /** Stops the embedded server, if this process started one. Its database file stays. */
  close(): Promise<void>;
}

type Log = (line: string) => void;

/**
 * Connects to TEMPORAL_ADDRESS (or the envconfig profile's address, with its TLS and API key) when set.
 * Otherwise uses a server already answering on localhost:7233 (EMBEDDED_TEMPORAL_PORT), such as `npm run server`,
 * or starts an embedded dev server whose database is a file in the data folder, so its histories (the checkpoints)
 * survive a kill of this process and the next run resumes from them.
 */
export async function connectOrStartTemporal(
  config: Config,
  { log = console.log }: { log?: Log } = {},
): Promise<TemporalTarget> {
  const noop = async (): Promise<void> => {};
  const configured = config.temporal;
  if (configured.address !== undefined) {
    return {
      address: configured.address,
      namespace: configured.namespace,
      secure: configured.secure,
      uiUrl: undefined,
      origin: 'configured',
      close: noop,
    };
  }
  const address = `127.0.0.1:${config.embeddedPort}`;
  const found = { address, namespace: config.temporal.namespace, secure: {}, uiUrl: uiOrigin(config) };
  if (await answers('127.0.0.1', config.embeddedPort)) {
    const recorded = recordedProcess(config.paths.temporalPid);
    if (recorded !== undefined && !ownerAlive(recorded)) {
      // Left running by an earlier `npm start` that was killed: it is ours now, to stop at the end of this run.
      await writePidFile(config.paths.temporalPid, recorded.pid, processRecord(process.pid));
      const untilExit = stopOnExit(recorded.pid, config.paths.temporalPid);
      const close = async (): Promise<void> => {
        untilExit.release();
        await stopProcess(recorded, config.paths.temporalPid);
      };
      return { ...found, origin: 'embedded', close };
    }
    if (recorded === undefined) checkUnrecordedServer(config, log);
    return { ...found, origin: 'already running', close: noop };
  }
  const server = await startEmbeddedServer(config, { log });
  return { ...found, origin: 'embedded', close: server.stop };
}

/** The embedded server's Web UI origin. */
export function uiOrigin(config: Pick<Config, 'uiPort'>): string {
  return `http://localhost:${config.uiPort}`;
}

/**
 * The last line of `npm start`: the Web UI's link while something serves it (checked now, after the run), otherwise
 * how to get one. Undefined for a configured server, whose UI this project does not know.
 */
export async function webUiLine(
  target: TemporalTarget,
  config: Pick<Config, 'uiPort'>,
): Promise<string | undefined> {
  if (target.uiUrl === undefined) return undefined;
  if (await uiAnswers(config.uiPort))
    return `Web UI: ${target.uiUrl}/namespaces/${target.namespace}/workflows`;
  return 'Web UI: none now (the embedded server stopped with this run); `npm run server` serves these runs in one.';
}

/**
 * Something answers on the embedded port and no pid file names it: say which process it is and how to stop it. A
 * dev server on this data folder's database whose file is gone (the data folder was removed under it) cannot serve
 * this run: refuse, with the command that stops it.
 */
function checkUnrecordedServer(config: Config, log: Log): void {
  const port = config.embeddedPort;
  const listener = listenerOn(port);
  const who =
    listener === undefined
      ? `a process this user cannot see (find it with \`ss -ltnp 'sport = :${port}'\`)`
      : `pid ${listener.pid}: ${listener.command}`;
  const stopIt = listener === undefined ? `stop that process` : `stop it with \`kill ${listener.pid}\``;
  const ourDatabase = listener?.command.includes(` --db-filename ${config.paths.temporal}`) ?? false;
  if (ourDatabase && !fs.existsSync(config.paths.temporal)) {
    throw new ConfigError(
      `a Temporal server left behind by an earlier run answers on 127.0.0.1:${port} (${who}), but its database ` +
        `${config.paths.temporal} is gone (was the data folder removed?): ${stopIt}, then run this again`,
    );
  }
  log(
    `Using the Temporal server that answers on 127.0.0.1:${port} (${who}); ${stopIt} when you are done with it.`,
  );
}
