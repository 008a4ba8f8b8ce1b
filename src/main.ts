import { Client, Connection } from '@temporalio/client';
import { NativeConnection } from '@temporalio/worker';
import { processDocuments, SAMPLES_DIR } from './batch';
import { dataConverterFor } from './codec';
import { loadConfig } from './config';
import { createDependencies } from './dependencies';
import { quietSdkLogs, runMain } from './run-main';
import { connectOrStartTemporal } from './temporal-server';
import { createPipelineWorker } from './worker';

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
  const connection = await Connection.connect({ address: target.address, ...target.secure });
  const nativeConnection = await NativeConnection.connect({ address: target.address, ...target.secure });
  const { deps, close } = createDependencies(config);
  const dataConverter = dataConverterFor(config);
  try {
    const client = new Client({ connection, namespace: target.namespace, dataConverter });
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
        `data in ${config.dataDir}`,
    );
    const outcomes = await worker.runUntil(processDocuments(client, config, paths, { since }));
    if (target.uiUrl !== undefined)
      console.log(`Web UI: ${target.uiUrl}/namespaces/${target.namespace}/workflows`);
    if (outcomes.some((o) => o.error !== undefined)) process.exitCode = 1;
  } finally {
    close();
    await nativeConnection.close();
    await connection.close();
    await target.close();
  }
}

runMain(run);
