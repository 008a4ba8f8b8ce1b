/**
 * The review queue as gauges on the worker's metrics page: how many runs await review and how long the oldest has
 * waited, sampled from the Temporal server's visibility index (one count and one list call, each with a deadline).
 * Reading the index adds nothing to any run's history: the gauges are the same whether a worker serves metrics or not.
 */
import { Counter, Gauge } from 'prom-client';
import type { Registry } from 'prom-client';
import type { Client } from '@temporalio/client';
import { AWAITING_REVIEW_QUERY } from '../contract/review';
import { logger } from '../telemetry/log';

/** The gauges' names (test/metrics-lint.test.ts checks their types; deploy/prometheus/alerts.yml alerts on them). */
export const REVIEW_GAUGE_NAMES = [
  'pipeline_review_awaiting',
  'pipeline_review_oldest_wait_seconds',
  'pipeline_review_timeout_seconds',
] as const;

/** How often the queue is sampled, and how long one sample may take before it counts as failed. */
export const REVIEW_SAMPLE_EVERY_MS = 15_000;
export const REVIEW_SAMPLE_DEADLINE_MS = 5_000;
/** The most runs one sample lists to find the oldest (the server lists the newest first). */
const LISTED_MAX = 10_000;

export interface ReviewGauges {
  /** Takes one sample now (the first is taken at start). */
  sample(): Promise<void>;
  stop(): void;
}

/**
 * Samples the review queue into `registry` every `everyMs`, starting now. `timeoutSeconds` is the configured
 * REVIEW_TIMEOUT_HOURS in seconds (the deadline of runs `npm start` starts), published beside the oldest wait so an
 * alert compares the two without repeating the setting. A failed sample counts in
 * `pipeline_review_samples_failed_total` and leaves the gauges at their last value.
 */
export function sampleReviewQueue(
  client: Client,
  registry: Registry,
  {
    timeoutSeconds,
    everyMs = REVIEW_SAMPLE_EVERY_MS,
    deadlineMs = REVIEW_SAMPLE_DEADLINE_MS,
  }: { timeoutSeconds: number; everyMs?: number; deadlineMs?: number },
): ReviewGauges {
  const awaiting = new Gauge({
    name: 'pipeline_review_awaiting',
    help: "Runs whose draft awaits a person's review (npm run review), by the Temporal server's index",
    registers: [registry],
  });
  const oldest = new Gauge({
    name: 'pipeline_review_oldest_wait_seconds',
    help: 'Seconds since the oldest run awaiting review started (its draft waits at most that long); 0 when none waits',
    registers: [registry],
  });
  const timeout = new Gauge({
    name: 'pipeline_review_timeout_seconds',
    help: 'REVIEW_TIMEOUT_HOURS in seconds: how long a draft waits before its deadline (then REVIEW_ON_TIMEOUT)',
    registers: [registry],
  });
  const failed = new Counter({
    name: 'pipeline_review_samples_failed_total',
    help: "Samples of the review queue the Temporal server did not answer within their deadline (the gauges keep the last sample's value)",
    registers: [registry],
  });
  timeout.set(timeoutSeconds);
  let running: Promise<void> | undefined;
  let toldUnregistered = false;

  async function once(): Promise<void> {
    try {
      const { count, startedAt } = await client.withDeadline(Date.now() + deadlineMs, async () => {
        const counted = client.workflow.count(AWAITING_REVIEW_QUERY);
        let first: number | undefined;
        let listed = 0;
        for await (const run of client.workflow.list({ query: AWAITING_REVIEW_QUERY, pageSize: 1_000 })) {
          const started = run.startTime.getTime();
          if (first === undefined || started < first) first = started;
          if (++listed >= LISTED_MAX) break;
        }
        return { count: (await counted).count, startedAt: first };
      });
      awaiting.set(count);
      oldest.set(startedAt === undefined ? 0 : Math.max(0, (Date.now() - startedAt) / 1000));
    } catch (err) {
      if (invalidQuery(err)) {
        // No ReviewStatus search attribute on this namespace: no run can await review here (src/contract/review.ts).
        awaiting.set(0);
        oldest.set(0);
        if (!toldUnregistered)
          logger().warn(
            `The review queue's gauges read 0: the server refuses the query ${AWAITING_REVIEW_QUERY} (${String(err)}); ` +
              'runs with a review need the ReviewStatus search attribute (docs/review.md)',
          );
        toldUnregistered = true;
        return;
      }
      failed.inc();
      logger().warn({ err }, `The review queue's gauges were not sampled: ${String(err)}`);
    }
  }
  const sample = (): Promise<void> => (running ??= once().finally(() => (running = undefined)));
  void sample();
  const timer = setInterval(() => void sample(), everyMs);
  timer.unref();
  return { sample, stop: () => clearInterval(timer) };
}

/** gRPC's INVALID_ARGUMENT anywhere in the error's causes: the server refused the query itself, not a moment's outage. */
function invalidQuery(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause)
    if ((e as { code?: unknown }).code === 3) return true;
  return false;
}
