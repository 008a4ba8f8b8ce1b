import os from 'node:os';
import { NativeConnection, Worker } from '@temporalio/worker';
import type { DataConverter } from '@temporalio/common';
import type { WorkerOptions } from '@temporalio/worker';
import { createActivities } from '../activities';
import type { ActivityDependencies } from '../activities';
import { dataConverterFor } from './codec';
import { loadConfig } from './config';
import { temporalConnection } from './connection';
import { createDependencies } from './dependencies';
import { quietSdkLogs, runMain } from './run-main';

export interface PipelineWorkerOptions {
  connection: NativeConnection;
  namespace: string;
  taskQueue: string;
  deps: ActivityDependencies;
  /** Shown in the history as the worker that ran each step; defaults to `<pid>@<host>`. */
  identity?: string;
  /** A prebuilt bundle (tests build one per suite); by default the workflows are bundled from source. */
  workflowBundle?: WorkerOptions['workflowBundle'];
  /** The payload codec setup (see src/codec.ts); clients of these runs must use the same. */
  dataConverter?: DataConverter;
}

/** A worker that runs the pipeline workflow and its three activities. */
export function createPipelineWorker(options: PipelineWorkerOptions): Promise<Worker> {
  const { connection, namespace, taskQueue, deps, identity, workflowBundle, dataConverter } = options;
  return Worker.create({
    connection,
    namespace,
    taskQueue,
    identity: identity ?? `${process.pid}@${os.hostname()}`,
    activities: createActivities(deps),
    dataConverter,
    ...(workflowBundle !== undefined
      ? { workflowBundle }
      : { workflowsPath: require.resolve('../workflows') }),
  });
}

/** `npm run worker`: a worker only, against TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE (default localhost:7233). */
async function run(): Promise<void> {
  quietSdkLogs();
  const config = loadConfig();
  const target = temporalConnection();
  const address = target.address ?? 'localhost:7233';
  const namespace = target.namespace ?? config.namespace;
  const connection = await NativeConnection.connect({ address, ...target.secure });
  const { deps, close } = createDependencies(config);
  try {
    const worker = await createPipelineWorker({
      connection,
      namespace,
      taskQueue: config.taskQueue,
      deps,
      dataConverter: dataConverterFor(config),
    });
    console.log(
      `Worker ${worker.options.identity} polling task queue "${config.taskQueue}" on ${address} ` +
        `(namespace ${namespace}; model ${deps.model.info.provider}/${deps.model.info.model}; ` +
        `publisher ${deps.publisher.kind}). Ctrl-C stops it; unfinished steps resume on the next worker.`,
    );
    await worker.run();
  } finally {
    close();
    await connection.close();
  }
}

if (require.main === module) runMain(run);
