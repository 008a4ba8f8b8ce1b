import { Runtime } from '@temporalio/worker';
import type { Config } from '../config';
import { freeLoopbackPort } from '../lib/loopback';
import { createLogger, SdkLogger, setLogger } from '../telemetry/log';
import type { Logger } from '../telemetry/log';
import { processMetrics, serveMetrics } from '../telemetry/metrics';
import type { MetricsPage } from '../telemetry/metrics';
import { startConfiguredTracing } from '../telemetry/tracing';
import type { Tracing } from '../telemetry/tracing';

type TelemetryConfig = Pick<Config, 'logLevel' | 'metrics' | 'tracing'>;

export interface ProcessTelemetry {
  logger: Logger;
  /** Started when an OTLP collector is configured (OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_* variables). */
  tracing: Tracing | undefined;
  /** Served when METRICS_PORT is set. */
  metricsPage: MetricsPage | undefined;
  /** Exports the spans still buffered and stops serving metrics. */
  close(): Promise<void>;
}

/**
 * Sets up this process's telemetry, once, before anything talks to Temporal: the logger (LOG_LEVEL; JSON unless on
 * a terminal) for the pipeline and for the Temporal SDK, whose native core forwards its lines to it instead of
 * printing them with colour codes; tracing when an OTLP endpoint is configured; and with METRICS_PORT, the metrics
 * page (the core's Prometheus exporter listens on a loopback port of its own, which the page relays).
 */
export async function installRuntime(config: TelemetryConfig): Promise<ProcessTelemetry> {
  const runtimeMetricsAddress =
    config.metrics === undefined ? undefined : `127.0.0.1:${await freeLoopbackPort()}`;
  const logger = installSdkRuntime(config, runtimeMetricsAddress);
  const tracing = startConfiguredTracing(config);
  const metricsPage =
    config.metrics === undefined
      ? undefined
      : await serveMetrics(config.metrics, {
          registry: processMetrics().registry,
          runtimeMetricsUrl: `http://${runtimeMetricsAddress}/metrics`,
        });
  if (metricsPage !== undefined) logger.info({ url: metricsPage.url }, `Metrics on ${metricsPage.url}`);
  return {
    logger,
    tracing,
    metricsPage,
    close: async () => {
      await metricsPage?.close();
      await tracing?.shutdown();
    },
  };
}

/**
 * The synchronous part of installRuntime for entry points without a metrics page (npm start, the crash tests'
 * worker processes): the logger at the configured level, and tracing when configured, returned so the caller
 * can shut it down at the end (which exports the spans still buffered).
 */
export function quietSdkLogs(config: TelemetryConfig): Tracing | undefined {
  installSdkRuntime(config, undefined);
  return startConfiguredTracing(config);
}

/**
 * How the native core names its metrics: by default its counters lack Prometheus's `_total` and its histograms
 * are in milliseconds with no unit in the name, which `promtool check metrics` rejects and PromQL's conventions
 * (rates per second, `_seconds`) trip over. With these, `temporal_workflow_completed` is served as
 * `temporal_workflow_completed_total` and `temporal_activity_execution_latency` as
 * `temporal_activity_execution_latency_seconds`, in seconds.
 */
const PROMETHEUS_NAMING = {
  countersTotalSuffix: true,
  unitSuffix: true,
  useSecondsForDurations: true,
} as const;

function installSdkRuntime(config: TelemetryConfig, runtimeMetricsAddress: string | undefined): Logger {
  const logger = createLogger({ level: config.logLevel });
  setLogger(logger);
  const verbose = config.logLevel === 'debug' || config.logLevel === 'trace';
  Runtime.install({
    logger: new SdkLogger(logger),
    // The entry points drain their workers on signals themselves (src/temporal/shutdown.ts): the SDK's hook
    // handles one signal and leaves the next, relayed by npm and tsx, to kill the process mid-call.
    shutdownSignals: [],
    telemetryOptions: {
      // Core's INFO lines are per poll and per connection: useful when debugging, noise otherwise.
      logging: { filter: { core: verbose ? 'INFO' : 'WARN', other: 'ERROR' }, forward: {} },
      ...(runtimeMetricsAddress === undefined
        ? {}
        : { metrics: { prometheus: { bindAddress: runtimeMetricsAddress, ...PROMETHEUS_NAMING } } }),
    },
  });
  return logger;
}
