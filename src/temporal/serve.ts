import type { DataConverter } from '@temporalio/common';
import type { NativeConnection, Worker } from '@temporalio/worker';
import type { ActivityDependencies } from '../steps/activities';
import type { Config } from '../config';
import { createDependencies } from '../dependencies';
import type { Dependencies } from '../dependencies';
import { dataConverterFor } from './codec';
import { configuredEndpoint, connectWorker } from './connection';
import { logger } from '../telemetry/log';
import { drainOnSignals } from './shutdown';
import type { DrainOptions } from './shutdown';
import { createPipelineWorker } from './worker';
import type { PipelineWorkerOptions } from './worker';

export interface ServeOptions extends Pick<PipelineWorkerOptions, 'identity' | 'workflowBundle'> {
  /** Wraps the wired dependencies before the worker gets them (the crash tests' kill switches). */
  adjust?: (deps: ActivityDependencies) => ActivityDependencies;
}

/** A pipeline worker with its parts: the dependencies from the composition root, released by `close`. */
export interface WiredWorker {
  worker: Worker;
  deps: ActivityDependencies;
  stores: Dependencies['stores'];
  close(): Promise<void>;
}

/**
 * The one way a process wires its pipeline worker (npm run worker's, npm start's): the configured stores, model
 * and publisher, the pipeline handed in at the composition root, the codec, and a drain on SIGTERM or Ctrl-C.
 */
export async function wirePipelineWorker(
  config: Config,
  connection: NativeConnection,
  namespace: string,
  {
    adjust,
    announce,
    ...options
  }: ServeOptions & { announce: DrainOptions['announce']; dataConverter?: DataConverter },
): Promise<WiredWorker> {
  const parts = await createDependencies(config);
  const deps = adjust ? adjust(parts.deps) : parts.deps;
  try {
    const worker = await createPipelineWorker({
      connection,
      namespace,
      taskQueue: config.taskQueue,
      deps,
      dataConverter: dataConverterFor(config),
      ...options,
    });
    drainOnSignals(worker, { announce, note: (line) => logger().info(line) });
    return { worker, deps, stores: parts.stores, close: () => parts.close() };
  } catch (err) {
    await parts.close();
    throw err;
  }
}

/**
 * Runs a pipeline worker on the configured server until the process is told to stop, with a
 * `Worker <identity> polling ...` line once it polls.
 */
export async function servePipeline(config: Config, options: ServeOptions = {}): Promise<void> {
  const endpoint = configuredEndpoint(config);
  const connection = await connectWorker(config, endpoint);
  try {
    const { worker, deps, stores, close } = await wirePipelineWorker(config, connection, endpoint.namespace, {
      ...options,
      announce: (line) => logger().warn(`${line}; unfinished steps resume on the next worker`),
    });
    try {
      // The readiness line, on stdout for whoever supervises the process (demo/worker-process.ts waits for
      // it); the logs go to stderr.
      console.log(
        `Worker ${worker.options.identity} polling task queue "${config.taskQueue}" on ${endpoint.address} ` +
          `(namespace ${endpoint.namespace}; model ${deps.model.info.provider}/${deps.model.info.model}; ` +
          `publisher ${deps.publisher.kind}; state in ${stores.backend}). Ctrl-C stops it; unfinished steps resume on the next worker.`,
      );
      await worker.run();
      logger().info(`Worker ${worker.options.identity} stopped: the steps it finished are recorded`);
    } finally {
      await close();
    }
  } finally {
    await connection.close();
  }
}
