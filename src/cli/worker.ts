import './compose';
import { loadConfig } from '../config';
import { runMain } from '../lib/run-main';
import { sampleReviewQueue } from '../runs/review-gauges';
import { connectClient } from '../temporal/connection';
import { installRuntime } from '../temporal/runtime';
import { processMetrics } from '../telemetry/metrics';
import { servePipeline } from '../temporal/serve';

/**
 * `npm run worker`: a worker only, against TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE (default localhost:7233), with
 * its metrics page on METRICS_PORT and its traces to OTEL_EXPORTER_OTLP_ENDPOINT when they are set.
 */
async function run(): Promise<void> {
  const config = loadConfig();
  const telemetry = await installRuntime(config);
  // With a metrics page, the review queue's gauges: sampled from the server's index, never from a run's history.
  const queue =
    telemetry.metricsPage === undefined
      ? undefined
      : await connectClient(config, { connectTimeout: '10 seconds' });
  const gauges =
    queue === undefined
      ? undefined
      : sampleReviewQueue(queue.client, processMetrics().registry, {
          timeoutSeconds: config.reviewDeadline.timeoutMinutes * 60,
        });
  try {
    await servePipeline(config);
  } finally {
    gauges?.stop();
    await queue?.close();
    await telemetry.close();
  }
}

runMain(run);
