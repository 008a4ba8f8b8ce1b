import os from 'node:os';
import { Worker } from '@temporalio/worker';
import type { DataConverter } from '@temporalio/common';
import type { InjectedSinks, NativeConnection, WorkerOptions } from '@temporalio/worker';
import { createActivities } from '../steps/activities';
import { registeredPipeline } from '../steps/registry';
import type { Pipeline } from '../steps/registry';
import type { ActivityDependencies } from '../steps/activities';
import { prebuiltBundle } from './bundle';
import { attemptReporting } from '../telemetry/attempts';
import { noMetrics } from '../telemetry/metrics';
import type { PipelineMetrics } from '../telemetry/metrics';
import type { ReviewSinks } from '../workflow/review';
import { phaseTiming } from '../telemetry/phases';
import type { PhaseTimer } from '../telemetry/phases';
import { activeTracing, WORKFLOW_TRACING_MODULE, workerTracing } from '../telemetry/tracing';
import type { Tracing } from '../telemetry/tracing';

export interface PipelineWorkerOptions {
  connection: NativeConnection;
  namespace: string;
  taskQueue: string;
  deps: ActivityDependencies;
  /** The steps and workflows to run; by default those the composition root handed in (src/cli/compose.ts). */
  pipeline?: Pipeline;
  /** Shown in the history as the worker that ran each step; defaults to `<pid>@<host>`. */
  identity?: string;
  /**
   * A prebuilt bundle (tests build one per suite); by default `npm run build`'s when up to date, else the workflows
   * are bundled from source. For workflow spans, build it with `workflowInterceptorModules(tracing)`.
   */
  workflowBundle?: WorkerOptions['workflowBundle'];
  /** The payload codec setup (see src/temporal/codec.ts); clients of these runs must use the same. */
  dataConverter?: DataConverter;
  /** Tracing to wire in; by default the process's (installRuntime starts it when OTLP is configured). */
  tracing?: Tracing | undefined;
  /** Times each step's phases into it (npm run bench's breakdown, src/telemetry/phases.ts); nothing is timed without. */
  phases?: PhaseTimer | undefined;
}

/**
 * How long a worker told to stop (SIGTERM: a deploy, `docker compose stop`) lets steps in flight finish before it
 * cancels them. Without it the SDK cancels at once and the next worker pays again for every model call in flight.
 * It must stay below the orchestrator's stop timeout (compose's `stop_grace_period: 30s`), or the process is
 * killed mid-grace; test/docker-compose.test.ts checks the two together.
 */
export const SHUTDOWN_GRACE_MS = 25_000;

/** The workflow interceptor modules a bundle needs: OpenTelemetry's when tracing, else none. */
export function workflowInterceptorModules(tracing: Tracing | undefined = activeTracing()): string[] {
  return tracing === undefined ? [] : [WORKFLOW_TRACING_MODULE];
}

/** A worker that runs the pipeline workflow and its activities. */
export function createPipelineWorker(options: PipelineWorkerOptions): Promise<Worker> {
  const { connection, namespace, taskQueue, deps, identity, dataConverter } = options;
  const pipeline = options.pipeline ?? registeredPipeline();
  const tracing = 'tracing' in options ? options.tracing : activeTracing();
  const traced = tracing === undefined ? undefined : workerTracing(tracing);
  // `npm run build`'s bundle when it is up to date (it has no tracing interceptors: with tracing on, the worker
  // bundles from source with them); else the workflows are bundled from source at start, as in development.
  const workflowBundle =
    options.workflowBundle ?? (tracing === undefined ? prebuiltBundle(pipeline.workflowsPath) : undefined);
  return Worker.create({
    connection,
    namespace,
    taskQueue,
    identity: identity ?? `${process.pid}@${os.hostname()}`,
    activities: createActivities(pipeline.steps, deps),
    dataConverter,
    shutdownGraceTime: SHUTDOWN_GRACE_MS,
    interceptors: {
      // The tracing interceptors come first, so the attempt reporter's log lines carry the step's trace ID.
      activity: [
        ...(traced?.activity ?? []),
        attemptReporting(deps.metrics ?? noMetrics),
        ...(options.phases === undefined ? [] : [phaseTiming(options.phases)]),
      ],
      ...(workflowBundle === undefined ? { workflowModules: workflowInterceptorModules(tracing) } : {}),
    },
    // What the workflows tell the worker outside their histories: spans (with tracing on), and each review's end.
    sinks: { ...traced?.sinks, ...reviewSinks(deps.metrics ?? noMetrics) },
    ...(workflowBundle !== undefined ? { workflowBundle } : { workflowsPath: pipeline.workflowsPath }),
  });
}

/** The review's sink: the workflow says how a review ended (never on replay), the worker counts it. */
function reviewSinks(metrics: PipelineMetrics): InjectedSinks<ReviewSinks> {
  return {
    review: {
      decided: {
        fn: (_info, outcome: string, waitedSeconds: number) => metrics.reviewDecided(outcome, waitedSeconds),
        callDuringReplay: false,
      },
    },
  };
}
