import { loadConfig } from '../config';
import { createDependencies } from '../dependencies';
import { runMain } from '../lib/run-main';
import { configuredEndpoint, connectWorker } from '../temporal/connection';
import { dataConverterFor } from '../temporal/codec';
import { quietSdkLogs } from '../temporal/runtime';
import { createPipelineWorker } from '../temporal/worker';

/** `npm run worker`: a worker only, against TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE (default localhost:7233). */
async function run(): Promise<void> {
  quietSdkLogs();
  const config = loadConfig();
  const endpoint = configuredEndpoint(config);
  const connection = await connectWorker(config, endpoint);
  const { deps, close } = createDependencies(config);
  try {
    const worker = await createPipelineWorker({
      connection,
      namespace: endpoint.namespace,
      taskQueue: config.taskQueue,
      deps,
      dataConverter: dataConverterFor(config),
    });
    console.log(
      `Worker ${worker.options.identity} polling task queue "${config.taskQueue}" on ${endpoint.address} ` +
        `(namespace ${endpoint.namespace}; model ${deps.model.info.provider}/${deps.model.info.model}; ` +
        `publisher ${deps.publisher.kind}). Ctrl-C stops it; unfinished steps resume on the next worker.`,
    );
    await worker.run();
  } finally {
    close();
    await connection.close();
  }
}

runMain(run);
