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
      : { workflowsPath: require.resolve('../../workflows') }),
  });
}
