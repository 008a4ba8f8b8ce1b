/**
 * The pipeline's own Prometheus metrics (tokens and cost, memo hits, reruns, publications), and the page a worker
 * serves them on together with the Temporal runtime's (which the SDK's native core exposes on a loopback port of
 * its own: the page here fetches and appends them, so Prometheus scrapes one target per worker).
 */
import http from 'node:http';
import { collectDefaultMetrics, Counter, Histogram, Registry } from 'prom-client';
import type { ModelInfo, StepName, Usage } from '../contract';
import { closeServer } from '../lib/loopback';

/** What became of one publish attempt. */
/** `held`: a delivery that may have landed unanswered, waiting for a verdict (npm run deliveries). */
export type PublicationOutcome = 'published' | 'duplicate' | 'superseded' | 'held' | 'failed';

/** The hooks the activities call; every one is cheap and never throws. */
export interface PipelineMetrics {
  /** Answers this attempt paid for (the kept one and the run's refused ones it reports): tokens and estimated cost. */
  modelPaid(step: StepName, model: ModelInfo, usage: Usage, costUsd: number | null): void;
  /** A model step answered from the memo: nothing paid. */
  memoHit(step: StepName): void;
  /** An attempt after the first: an earlier one crashed, stalled, timed out or failed. */
  stepRerun(step: string): void;
  /** A failed attempt, and whether Temporal will retry it. */
  stepFailed(step: string, retried: boolean): void;
  publication(outcome: PublicationOutcome): void;
  /** The provider pushed back on a call: a 429 (`rate_limited`) or an "overloaded" answer. */
  modelRefused(step: string, model: ModelInfo, kind: 'rate_limited' | 'overloaded'): void;
  /** Time a call waited for its turn at the provider's limit, in seconds. */
  limiterWaited(model: ModelInfo, seconds: number): void;
  /** A review ended (approved, edited, rejected, expired) after its draft waited this long, in seconds. */
  reviewDecided(outcome: string, waitedSeconds: number): void;
}

/** Metrics that go nowhere: the default of the activities' dependencies. */
export const noMetrics: PipelineMetrics = {
  modelPaid: () => {},
  memoHit: () => {},
  stepRerun: () => {},
  stepFailed: () => {},
  publication: () => {},
  modelRefused: () => {},
  limiterWaited: () => {},
  reviewDecided: () => {},
};

/** The names this module registers, for the dashboard's and the tests' checks. */
export const PIPELINE_METRIC_NAMES = [
  'pipeline_model_tokens_total',
  'pipeline_model_cost_usd_total',
  'pipeline_memo_hits_total',
  'pipeline_step_reruns_total',
  'pipeline_step_failures_total',
  'pipeline_publications_total',
  'pipeline_model_refusals_total',
  'pipeline_model_limiter_wait_seconds_total',
  'pipeline_review_decisions_total',
  'pipeline_review_wait_seconds',
] as const;

/** The review wait's buckets, in seconds: a minute to a week. */
const REVIEW_WAIT_BUCKETS = [60, 300, 900, 3_600, 4 * 3_600, 86_400, 3 * 86_400, 7 * 86_400];

/** The pipeline's counters, registered on `registry`. */
export function pipelineMetrics(registry: Registry): PipelineMetrics {
  const [tokens, cost, memoHits, reruns, failures, publications, refusals, limiterWait] = [
    new Counter({
      name: 'pipeline_model_tokens_total',
      help: 'Model tokens paid for, by step, provider, model and type (input or output); memo hits add none',
      labelNames: ['step', 'provider', 'model', 'type'],
      registers: [registry],
    }),
    new Counter({
      name: 'pipeline_model_cost_usd_total',
      help: 'Estimated model cost in US dollars, by step, provider and model (models without a price add none)',
      labelNames: ['step', 'provider', 'model'],
      registers: [registry],
    }),
    new Counter({
      name: 'pipeline_memo_hits_total',
      help: 'Model steps answered from the memo of paid answers instead of a new call',
      labelNames: ['step'],
      registers: [registry],
    }),
    new Counter({
      name: 'pipeline_step_reruns_total',
      help: 'Step attempts after the first: an earlier attempt crashed, stalled, timed out or failed',
      labelNames: ['step'],
      registers: [registry],
    }),
    new Counter({
      name: 'pipeline_step_failures_total',
      help: 'Step attempts that failed on this worker, and whether Temporal retries them',
      labelNames: ['step', 'retried'],
      registers: [registry],
    }),
    new Counter({
      name: 'pipeline_publications_total',
      help: 'Publish attempts by outcome: published, duplicate (the key was known), superseded, held (waiting for a verdict: npm run deliveries), failed',
      labelNames: ['outcome'],
      registers: [registry],
    }),
    new Counter({
      name: 'pipeline_model_refusals_total',
      help: 'Model calls the provider pushed back on, by kind: rate_limited (429) or overloaded (503, 529); each waits its turn and goes again',
      labelNames: ['step', 'provider', 'model', 'kind'],
      registers: [registry],
    }),
    new Counter({
      name: 'pipeline_model_limiter_wait_seconds_total',
      help: "Seconds model calls waited for their turn at the provider's limit (the fleet's pacing, a refusal's Retry-After)",
      labelNames: ['provider', 'model'],
      registers: [registry],
    }),
  ];
  const decisions = new Counter({
    name: 'pipeline_review_decisions_total',
    help: 'Reviews ended, by outcome: approved, edited, rejected by a person, or expired at the deadline',
    labelNames: ['outcome'],
    registers: [registry],
  });
  const reviewWait = new Histogram({
    name: 'pipeline_review_wait_seconds',
    help: "Seconds a draft waited for its review's decision (or its deadline)",
    labelNames: ['outcome'],
    buckets: REVIEW_WAIT_BUCKETS,
    registers: [registry],
  });
  return {
    reviewDecided(outcome, waitedSeconds) {
      decisions.inc({ outcome });
      reviewWait.observe({ outcome }, Math.max(0, waitedSeconds));
    },
    modelPaid(step, model, usage, costUsd) {
      const labels = { step, provider: model.provider, model: model.model };
      tokens.inc({ ...labels, type: 'input' }, usage.inputTokens);
      tokens.inc({ ...labels, type: 'output' }, usage.outputTokens);
      if (costUsd !== null) cost.inc(labels, costUsd);
    },
    memoHit: (step) => memoHits.inc({ step }),
    stepRerun: (step) => reruns.inc({ step }),
    stepFailed: (step, retried) => failures.inc({ step, retried: String(retried) }),
    publication: (outcome) => publications.inc({ outcome }),
    modelRefused: (step, model, kind) =>
      refusals.inc({ step, provider: model.provider, model: model.model, kind }),
    limiterWaited: (model, seconds) =>
      limiterWait.inc({ provider: model.provider, model: model.model }, Math.max(0, seconds)),
  };
}

let processWide: { registry: Registry; metrics: PipelineMetrics } | undefined;

/** This process's registry and pipeline counters, made on first use; the worker's metrics page serves them. */
export function processMetrics(): { registry: Registry; metrics: PipelineMetrics } {
  if (processWide === undefined) {
    const registry = new Registry();
    processWide = { registry, metrics: pipelineMetrics(registry) };
  }
  return processWide;
}

export interface MetricsPage {
  /** `http://host:port/metrics`. */
  url: string;
  close(): Promise<void>;
}

/**
 * Serves `/metrics` on `host:port`: the Temporal runtime's metrics (fetched from `runtimeMetricsUrl`, the native
 * core's Prometheus endpoint) followed by `registry`'s, with the Node process's own (CPU, memory, event loop).
 */
export async function serveMetrics(
  { host, port }: { host: string; port: number },
  { registry, runtimeMetricsUrl }: { registry: Registry; runtimeMetricsUrl: string | undefined },
): Promise<MetricsPage> {
  processDefaults(registry);
  const server = http.createServer((req, res) => {
    if (req.method !== 'GET' || new URL(req.url ?? '/', 'http://x').pathname !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('Not found: metrics are on /metrics\n');
      return;
    }
    void page().then(
      (body) => res.writeHead(200, { 'content-type': registry.contentType }).end(body),
      (err: unknown) => res.writeHead(500, { 'content-type': 'text/plain' }).end(`${String(err)}\n`),
    );
  });
  async function page(): Promise<string> {
    const runtime = runtimeMetricsUrl === undefined ? '' : await runtimeMetrics(runtimeMetricsUrl);
    return `${runtime}${await registry.metrics()}`;
  }
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const address = server.address();
  const bound = address !== null && typeof address === 'object' ? address.port : port;
  const shown = host.includes(':') ? `[${host}]` : host;
  return { url: `http://${shown}:${bound}/metrics`, close: () => closeServer(server) };
}

/**
 * prom-client's default metrics of the Node process (CPU, memory, event loop, GC), less the three gauges it names
 * `nodejs_active_{handles,requests,resources}_total`: a `_total` name says counter to Prometheus (promtool rejects
 * it on a gauge), and each is only the sum of the by-type gauge beside it (`sum(nodejs_active_handles)`).
 */
function processDefaults(registry: Registry): void {
  collectDefaultMetrics({ register: registry });
  for (const kind of ['handles', 'requests', 'resources']) {
    registry.removeSingleMetric(`nodejs_active_${kind}_total`);
  }
}

/** The native core's page; a comment instead when it does not answer, so the pipeline's part is still served. */
async function runtimeMetrics(url: string): Promise<string> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(5_000) });
    const text = await res.text();
    return text.endsWith('\n') || text === '' ? text : `${text}\n`;
  } catch (err) {
    return `# The Temporal runtime's metrics did not answer at ${url}: ${String(err)}\n`;
  }
}
