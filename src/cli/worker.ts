import './compose';
import { loadConfig } from '../config';
import { runMain } from '../lib/run-main';
import { installRuntime } from '../temporal/runtime';
import { servePipeline } from '../temporal/serve';

/**
 * `npm run worker`: a worker only, against TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE (default localhost:7233), with
 * its metrics page on METRICS_PORT and its traces to OTEL_EXPORTER_OTLP_ENDPOINT when they are set.
 */
async function run(): Promise<void> {
  const config = loadConfig();
  const telemetry = await installRuntime(config);
  try {
    await servePipeline(config);
  } finally {
    await telemetry.close();
  }
}

runMain(run);
