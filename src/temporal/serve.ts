import type { ActivityDependencies } from '../steps/activities';
import type { Config } from '../config';
import { createDependencies } from '../dependencies';
import { dataConverterFor } from './codec';
import { configuredEndpoint, connectWorker } from './connection';
import { logger } from '../telemetry/log';
import { drainOnSignals } from './shutdown';
import { createPipelineWorker } from './worker';
import type { PipelineWorkerOptions } from './worker';

export interface ServeOptions extends Pick<PipelineWorkerOptions, 'identity' | 'workflowBundle'> {
  /** Wraps the wired dependencies before the worker gets them (the crash tests' kill switches). */
  adjust?: (deps: ActivityDependencies) => ActivityDependencies;
}

/**
 * Runs a pipeline worker on the configured server until the process is told to stop: the dependencies from the
 * composition root, the configured codec, and a `Worker <identity> polling ...` line once it polls.
 */
export async function servePipeline(
  config: Config,
  { adjust, ...options }: ServeOptions = {},
): Promise<void> {
  const endpoint = configuredEndpoint(config);
  const connection = await connectWorker(config, endpoint);
  const parts = await createDependencies(config);
  const deps = adjust ? adjust(parts.deps) : parts.deps;
  try {
    const worker = await createPipelineWorker({
      connection,
      namespace: endpoint.namespace,
      taskQueue: config.taskQueue,
      deps,
      dataConverter: dataConverterFor(config),
      ...options,
    });
    drainOnSignals(worker, {
      announce: (line) => logger().warn(`${line}; unfinished steps resume on the next worker`),
      note: (line) => logger().info(line),
    });
    // The readiness line, on stdout for whoever supervises the process (demo/worker-process.ts waits for
    // it); the logs go to stderr.
    console.log(
      `Worker ${worker.options.identity} polling task queue "${config.taskQueue}" on ${endpoint.address} ` +
        `(namespace ${endpoint.namespace}; model ${deps.model.info.provider}/${deps.model.info.model}; ` +
        `publisher ${deps.publisher.kind}; state in ${parts.stores.backend}). Ctrl-C stops it; unfinished steps resume on the next worker.`,
    );
    await worker.run();
    logger().info(`Worker ${worker.options.identity} stopped: the steps it finished are recorded`);
  } finally {
    await parts.close();
    await connection.close();
  }
}
