import { loadConfig, SAMPLES_DIR } from '../config';
import { createDependencies } from '../dependencies';
import { runMain } from '../lib/run-main';
import { processDocuments } from '../runs/batch';
import { exitCodeFor } from '../runs/result-table';
import { connectClient, connectWorker } from '../temporal/connection';
import { connectOrStartTemporal } from '../temporal/dev-server';
import { quietSdkLogs } from '../temporal/runtime';
import { createPipelineWorker } from '../temporal/worker';

/**
 * `npm start [files or folders]`: the whole job in one process. Finds or starts a Temporal server (embedded,
 * with its database in the data folder), runs a worker, submits the documents (the shipped samples by default)
 * and prints the results. Kill it at any point and run it again: finished steps are not repeated.
 */
async function run(): Promise<void> {
  const since = Date.now();
  quietSdkLogs();
  const config = loadConfig();
  const paths = process.argv.length > 2 ? process.argv.slice(2) : [SAMPLES_DIR];
  const target = await connectOrStartTemporal(config);
  console.log(`Temporal: ${target.address} (${target.origin}), namespace ${target.namespace}`);
  const { client, dataConverter, close: closeClient } = await connectClient(config, { endpoint: target });
  const nativeConnection = await connectWorker(config, target);
  const { deps, stores, close } = await createDependencies(config);
  let interrupted = false;
  try {
    const worker = await createPipelineWorker({
      connection: nativeConnection,
      namespace: target.namespace,
      taskQueue: config.taskQueue,
      deps,
      dataConverter,
    });
    console.log(
      `Worker ${worker.options.identity}: model ${deps.model.info.provider}/${deps.model.info.model}, ` +
        `publisher ${deps.publisher.kind}, payloads ${dataConverter ? 'encrypted' : 'in plaintext'}, ` +
        `state in ${stores.backend === 'postgres' ? 'PostgreSQL' : config.dataDir}`,
    );
    // The SDK's runtime shuts the worker down on Ctrl-C (and SIGTERM); here we only say what is kept.
    const checkpoint = target.origin === 'embedded' ? config.paths.temporal : 'the Temporal server';
    process.once('SIGINT', () => {
      interrupted = true;
      console.log(`\nStopping. Finished steps are recorded in ${checkpoint}; run npm start again to resume.`);
    });
    let outcomes;
    try {
      outcomes = await worker.runUntil(processDocuments(client, config, stores.blobs, paths, { since }));
    } catch (err) {
      if (!interrupted) throw err;
      return;
    }
    if (target.uiUrl !== undefined)
      console.log(`Web UI: ${target.uiUrl}/namespaces/${target.namespace}/workflows`);
    process.exitCode = exitCodeFor(outcomes);
  } finally {
    await close();
    await nativeConnection.close();
    await closeClient();
    await target.close();
    // Stop here: the abandoned progress polling would otherwise retry on the connections just closed.
    if (interrupted) process.exit(130);
  }
}

runMain(run);
