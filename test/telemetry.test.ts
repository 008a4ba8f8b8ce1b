/**
 * Observability through real runs on a dev server. Traces: the SDK's OpenTelemetry interceptors with this process's
 * tracer provider over an in-memory exporter make one document one trace (start, run, each step, the model and
 * publish calls), and no span carries the document's text or a secret. Metrics: a real `npm run worker` process
 * with METRICS_PORT serves the Temporal runtime's metrics and the pipeline's counters on one page.
 */
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { historyFromJSON } from '@temporalio/common/lib/proto-utils';
import { bundleWorkflowCode, Worker } from '@temporalio/worker';
import type { WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { loadConfig } from '../src/config';
import { stepNames } from '../src/steps/registry';
import '../src/cli/compose';
import type { PipelineInput } from '../src/contract';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import { connectClient } from '../src/temporal/connection';
import { createPipelineWorker, workflowInterceptorModules } from '../src/temporal/worker';
import { PIPELINE_METRIC_NAMES } from '../src/telemetry/metrics';
import { activeTracing, startTracing, workerTracing } from '../src/telemetry/tracing';
import {
  devServerEnv,
  DOCUMENT_SPANS_UNDER_START,
  installQuietRuntime,
  modelServerFor,
  normalAnswer,
  openAIModel,
  pipelineInput,
  SAMPLE_TEXT,
  silentLogger,
  startMetricsWorker,
  SUMMARY,
  tempParts,
  webhookPublisher,
} from './helpers';
import { dashboardQueries } from './dashboard';
import { cleanupAfterAll, scratchDir } from './scratch';

installQuietRuntime();
const spans = new InMemorySpanExporter();
startTracing(new SimpleSpanProcessor(spans));
const defer = cleanupAfterAll();
/** Where the trace and the metrics excerpt are shown to people. */
const SHOWN = path.join(__dirname, '..', 'docs', 'observability.md');

let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

/** Runs `input` on `taskQueue` with a client made as the entry points make theirs, and returns its run ID. */
async function runDocument(taskQueue: string, input: PipelineInput, workflowId: string): Promise<string> {
  const { client, close } = await connectClient(
    loadConfig({ TEMPORAL_ADDRESS: env.address, TEMPORAL_NAMESPACE: env.namespace ?? 'default' }),
  );
  try {
    const handle = await client.workflow.start('documentPipeline', { taskQueue, workflowId, args: [input] });
    await handle.result();
    return handle.firstExecutionRunId;
  } finally {
    await close();
  }
}

let bundle: Promise<WorkflowBundleWithSourceMap> | undefined;
/** The workflow code with the OpenTelemetry workflow interceptors, as a traced worker bundles it. */
function tracedBundle(): Promise<WorkflowBundleWithSourceMap> {
  bundle ??= bundleWorkflowCode({
    workflowsPath: require.resolve('../workflows'),
    workflowInterceptorModules: workflowInterceptorModules(),
    logger: silentLogger,
  });
  return bundle;
}

/** The trace as indented span names, children in step order (summarize and tag start together). */
function renderTree(all: readonly ReadableSpan[]): string {
  const order = (s: ReadableSpan) => {
    const step = stepNames().findIndex((name) => s.name.endsWith(`:${name}`));
    return step === -1 ? stepNames().length : step;
  };
  const lines: string[] = [];
  const walk = (parent: string | undefined, depth: number) => {
    const children = all
      .filter((s) => s.parentSpanId === parent)
      .sort((a, b) => order(a) - order(b) || a.name.localeCompare(b.name));
    for (const child of children) {
      lines.push(`${'  '.repeat(depth)}${child.name}`);
      walk(child.spanContext().spanId, depth + 1);
    }
  };
  walk(undefined, 0);
  return lines.join('\n');
}

describe('tracing', () => {
  it(
    'makes one document one trace: start, run, each step, the model and publish calls, keyed, without text',
    { timeout: 60_000 },
    async () => {
      const apiKey = `sk-${randomBytes(12).toString('hex')}`;
      const webhookSecret = `whsec_${randomBytes(32).toString('base64')}`;
      const model = openAIModel(await modelServerFor(defer, normalAnswer), { apiKey });
      const store = new SqlitePublicationStore(
        path.join(scratchDir(defer, 'trace-receiver-'), 'receiver.db'),
      );
      defer(() => store.close());
      const receiver = await startReceiver(store, { secret: webhookSecret, scheduleSkewMs: Infinity });
      defer(() => receiver.close());
      const publisher = webhookPublisher(defer, receiver.url, { secret: webhookSecret });
      const local = await tempParts(defer, { model, publisher });
      const taskQueue = `trace-${randomUUID()}`;
      const workflowBundle = await tracedBundle();
      const worker = await createPipelineWorker({
        connection: env.nativeConnection,
        namespace: env.namespace ?? 'default',
        taskQueue,
        deps: local.deps,
        workflowBundle,
      });
      const workflowId = `wf-${randomUUID()}`;
      const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
      const runId = await worker.runUntil(runDocument(taskQueue, input, workflowId));

      // The workflow's spans leave the sandbox through a sink after its last activation.
      const deadline = Date.now() + 10_000;
      while (!spans.getFinishedSpans().some((s) => s.name === 'RunWorkflow:documentPipeline')) {
        assert.ok(Date.now() < deadline, 'the workflow span was never exported');
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      const all = spans.getFinishedSpans();
      assert.deepEqual(
        [...new Set(all.map((s) => s.spanContext().traceId))].length,
        1,
        'more than one trace',
      );
      const tree = renderTree(all);
      assert.equal(
        tree,
        `StartWorkflow:documentPipeline
${DOCUMENT_SPANS_UNDER_START}`,
      );
      // The document trace shown there is a batch's, whose first span links back to the batch: ` -> ...`.
      const readme = fs.readFileSync(SHOWN, 'utf8').replace(/ -> .*$/gm, '');
      assert.ok(
        readme.includes(tree),
        `docs/observability.md does not show the trace this test collects:\n${tree}`,
      );

      const keys = (name: string) =>
        all.filter((s) => s.name === name).map((s) => s.attributes['pipeline.idempotency_key']);
      assert.deepEqual(keys('model call').sort(), [`${runId}:summarize`, `${runId}:tag`]);
      assert.deepEqual(keys('publish POST'), [`${runId}:publish`]);
      assert.ok(
        all.filter((s) => s.name === 'model call').every((s) => s.attributes['gen_ai.request.model']),
      );

      // Nothing a span carries may quote the document, the model's answer or a secret: not a line, not a piece
      // of one (every 16 characters of the text and the summary, at every 4th position).
      const quotes = (text: string): string[] =>
        text
          .split('\n')
          .flatMap((line) =>
            Array.from({ length: Math.max(0, Math.ceil((line.length - 15) / 4)) }, (_, i) =>
              line.slice(i * 4, i * 4 + 16),
            ),
          );
      const forbidden = [
        ...quotes(SAMPLE_TEXT),
        ...quotes(SUMMARY),
        apiKey,
        webhookSecret,
        webhookSecret.slice('whsec_'.length),
      ];
      for (const span of all) {
        const carried = JSON.stringify([span.attributes, span.events, span.status, span.resource.attributes]);
        for (const text of forbidden) {
          assert.ok(!carried.includes(text), `span ${span.name} carries "${text.slice(0, 40)}"`);
        }
      }
    },
  );
  it('replays the committed histories with the tracing interceptors in the workflow code', async () => {
    const dir = path.join(__dirname, 'histories');
    const histories = fs
      .readdirSync(dir)
      .filter((file) => file.endsWith('.json'))
      .map((file) => ({
        workflowId: file,
        history: historyFromJSON(JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8'))),
      }));
    assert.ok(histories.length > 0);
    const tracing = activeTracing();
    assert.ok(tracing);
    const results = Worker.runReplayHistories(
      { workflowBundle: await tracedBundle(), sinks: workerTracing(tracing).sinks },
      histories,
    );
    for await (const result of results) assert.equal(result.error, undefined, result.workflowId);
  });
});

describe('metrics', () => {
  it(
    "npm run worker with METRICS_PORT serves the Temporal runtime's metrics and the pipeline's counters",
    { timeout: 90_000 },
    async () => {
      const local = await tempParts(defer);
      const taskQueue = `metrics-${randomUUID()}`;
      const { metricsPort: port } = await startMetricsWorker(defer, env, local.dir, taskQueue);

      // The same document twice under one workflow ID: the second run's model steps are memo hits.
      const workflowId = `wf-${randomUUID()}`;
      const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
      await runDocument(taskQueue, input, workflowId);
      await runDocument(taskQueue, input, workflowId);

      const res = await fetch(`http://127.0.0.1:${port}/metrics`);
      assert.equal(res.status, 200);
      const page = await res.text();
      const value = (series: string) => {
        const line = page.split('\n').find((l) => l.startsWith(`${series} `));
        assert.ok(line, `no ${series} on the metrics page:\n${page}`);
        return Number(line.slice(series.length + 1));
      };
      // The runtime's part, from the SDK's native core.
      assert.match(page, /^temporal_workflow_completed_total\{.*\} [1-9]/m);
      assert.match(
        page,
        /^temporal_activity_execution_latency_seconds_count\{.*activity_type="publish".*\} [1-9]/m,
      );
      // The pipeline's part.
      const offline = 'provider="offline",model="extractive-wink-nlp"';
      assert.ok(value(`pipeline_model_tokens_total{step="summarize",${offline},type="input"}`) > 0);
      assert.ok(value(`pipeline_model_tokens_total{step="tag",${offline},type="output"}`) > 0);
      assert.equal(value(`pipeline_model_cost_usd_total{step="summarize",${offline}}`), 0);
      assert.equal(value('pipeline_memo_hits_total{step="summarize"}'), 1);
      assert.equal(value('pipeline_memo_hits_total{step="tag"}'), 1);
      assert.ok(value('pipeline_publications_total{outcome="published"}') >= 1);
      for (const name of PIPELINE_METRIC_NAMES)
        assert.match(
          page,
          new RegExp(`^# TYPE ${name} ${name.endsWith('_seconds') ? 'histogram' : 'counter'}$`, 'm'),
        );

      // The compose dashboard queries only metrics this page has.
      for (const name of dashboardQueries().metricNames) {
        // A counter nobody has counted yet is declared (# TYPE) without samples.
        const declared = new RegExp(`^(# TYPE )?${name}(_bucket)?[{ ]`, 'm');
        assert.match(page, declared, `the dashboard queries ${name}, which is not on the page`);
      }
      // The excerpt in docs/observability.md names only metrics this page has.
      const readme = fs.readFileSync(SHOWN, 'utf8');
      const excerpt = /<!-- metrics excerpt -->\s*```text\n([\s\S]*?)```/.exec(readme)?.[1];
      assert.ok(excerpt !== undefined, 'docs/observability.md has no metrics excerpt');
      for (const line of excerpt.split('\n').filter((l) => l !== '' && !l.startsWith('#'))) {
        const name = /^[a-z_]+/.exec(line)?.[0] ?? '';
        assert.match(
          page,
          new RegExp(`^${name}[{ ]`, 'm'),
          `docs/observability.md shows ${name}, which the page does not have`,
        );
      }
    },
  );
});
