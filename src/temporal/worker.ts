import os from 'node:os';
import { Worker } from '@temporalio/worker';
import type { DataConverter } from '@temporalio/common';
import type { NativeConnection, WorkerOptions } from '@temporalio/worker';
import { createActivities } from '../../activities';
import type { ActivityDependencies } from '../../activities';

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

/**
 * How long a worker told to stop (SIGTERM: a deploy, `docker compose stop`) lets steps in flight finish before it
 * cancels them. Without it the SDK cancels at once and the next worker pays again for every model call in flight.
 * It must stay below the orchestrator's stop timeout (compose's `stop_grace_period: 30s`), or the process is
 * killed mid-grace; test/docker-compose.test.ts checks the two together.
 */
export const SHUTDOWN_GRACE_MS = 25_000;

/** A worker that runs the pipeline workflow and its activities. */
export function createPipelineWorker(options: PipelineWorkerOptions): Promise<Worker> {
  const { connection, namespace, taskQueue, deps, identity, workflowBundle, dataConverter } = options;
  return Worker.create({
    connection,
    namespace,
    taskQueue,
    identity: identity ?? `${process.pid}@${os.hostname()}`,
    activities: createActivities(deps),
    dataConverter,
    shutdownGraceTime: SHUTDOWN_GRACE_MS,
    ...(workflowBundle !== undefined
      ? { workflowBundle }
      : { workflowsPath: require.resolve('../../workflows') }),
  });
}
