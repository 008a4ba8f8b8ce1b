import './compose';
import { loadConfig } from '../config';
import { runMain } from '../lib/run-main';
import { uiOrigin } from '../temporal/choose-server';
import { startEmbeddedServer } from '../temporal/embedded-server';
import { ownerAlive, recordedProcess, stopProcess } from '../temporal/pid-file';
import { answers } from '../temporal/probes';
import { listenerOn } from '../temporal/processes';

/**
 * `npm run server`: the embedded Temporal dev server on the data folder's database, in the foreground until Ctrl-C.
 * Its Web UI shows every run `npm start` recorded there; `npm start`, `npm run worker` and `npm run report` use it
 * while it is up (it answers on EMBEDDED_TEMPORAL_PORT, 7233 by default).
 */
async function run(): Promise<void> {
  const config = loadConfig();
  const port = config.embeddedPort;
  const ui = `${uiOrigin(config)}/namespaces/${config.temporal.namespace}/workflows`;
  if (await answers('127.0.0.1', port)) {
    const recorded = recordedProcess(config.paths.temporalPid);
    if (recorded !== undefined && !ownerAlive(recorded)) {
      // Left behind by a killed `npm start`: stop it and serve the same database in the foreground instead.
      console.log(`Stopping the server an earlier run left behind (pid ${recorded.pid})...`);
      await stopProcess(recorded, config.paths.temporalPid);
    } else {
      const who = recorded ?? listenerOn(port);
      console.log(
        `A Temporal server already answers on 127.0.0.1:${port}` +
          `${who !== undefined ? ` (pid ${who.pid}; stop it with \`kill ${who.pid}\`)` : ''}. ` +
          `Its Web UI, if it has one: ${ui}`,
      );
      process.exitCode = 1;
      return;
    }
  }
  if (config.temporal.address !== undefined) {
    console.log(
      `Note: TEMPORAL_ADDRESS=${config.temporal.address} is set, so npm start and npm run worker use that server, ` +
        'not this one.',
    );
  }
  const server = await startEmbeddedServer(config);
  console.log(
    `Temporal dev server on 127.0.0.1:${port}, database ${config.paths.temporal} (log: ` +
      `${config.paths.temporalLog}). Web UI: ${ui}`,
  );
  console.log('npm start, npm run worker and npm run report use it while it runs. Ctrl-C stops it.');
  const signal = await Promise.race([
    new Promise<string>((resolve) => process.once('SIGINT', () => resolve('SIGINT'))),
    new Promise<string>((resolve) => process.once('SIGTERM', () => resolve('SIGTERM'))),
    server.exited.then(() => 'exit'),
  ]);
  if (signal === 'exit') {
    console.error(`The server stopped by itself; the end of its log is in ${config.paths.temporalLog}.`);
    process.exitCode = 1;
    return;
  }
  await server.stop();
  console.log(`\nStopped. The histories stay in ${config.paths.temporal}; npm run server serves them again.`);
}

runMain(run);
