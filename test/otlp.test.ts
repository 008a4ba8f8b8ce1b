/**
 * Traces as a collector receives them, through the real entry points: `npm run pipeline` and `npm run worker`
 * processes export to a protobuf-only OTLP/HTTP receiver that decodes with the official proto definitions
 * (test/otlp-receiver.py). One document is one trace, the batch's trace links to them, the polls of a waiting
 * command are not traced, and the resource says what OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES say. A
 * collector that refuses, fails or stalls never changes the command's outcome, and costs one log line.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { OTLPTraceExporter as ProtobufTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { z } from 'zod';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import { closeServer, listenOnLoopback } from '../src/lib/loopback';
import { stepNames } from '../src/steps/registry';
import '../src/cli/compose';
import { createLogger } from '../src/telemetry/log';
import { ReportingExporter, SHUTDOWN_EXPORT_MS } from '../src/telemetry/tracing';
import { startWorkerProcess } from '../demo/worker-process';
import type { WorkerProcess } from '../demo/worker-process';
import { devServerEnv, DOCUMENT_SPANS_UNDER_START, installQuietRuntime } from './helpers';
import { loadConfig } from '../src/config';
import { connectClient } from '../src/temporal/connection';
import { awaitingReview, decide } from '../src/runs/review-queue';
import { ensureOtlpProto, startOtlpReceiver } from './otlp-proto';
import type { DecodedSpan } from './otlp-proto';
import { cleanupAfterAll, freePort, scratchDir } from './scratch';

installQuietRuntime();
const ROOT = path.resolve(__dirname, '..');
const SHOWN = path.join(ROOT, 'docs', 'observability.md');
const defer = cleanupAfterAll();

let env: TestWorkflowEnvironment;
let python: string;

before(async () => {
  [env, python] = await Promise.all([devServerEnv(), ensureOtlpProto()]);
  defer(() => env.teardown());
});

/** What every process of a test shares: the server, the task queue and the data folder. */
function baseEnv(dataDir: string, taskQueue: string): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '',
    TEMPORAL_ADDRESS: env.address,
    TEMPORAL_NAMESPACE: env.namespace ?? 'default',
    TEMPORAL_TASK_QUEUE: taskQueue,
    DATA_DIR: dataDir,
    LOG_LEVEL: 'info',
  };
}

/** `count` of the shipped samples, copied into a folder of their own. */
function documents(count: number): string {
  const dir = scratchDir(defer, 'otlp-docs-');
  for (const file of fs.readdirSync(path.join(ROOT, 'samples')).sort().slice(0, count)) {
    fs.copyFileSync(path.join(ROOT, 'samples', file), path.join(dir, file));
  }
  return dir;
}

interface Finished {
  code: number | null;
  output: string;
  /** When the summary line was printed and when the process exited (ms since the epoch). */
  summaryAt: number;
  exitedAt: number;
}

/** `npm run pipeline -- <dir>` as its own process with `env`; killed after `timeoutMs` (then `code` is null). */
async function pipeline(
  dir: string,
  processEnv: Record<string, string>,
  timeoutMs = 180_000,
): Promise<Finished> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'pipeline.ts'), dir],
    {
      cwd: ROOT,
      env: processEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  defer(() => void child.kill('SIGKILL'));
  let output = '';
  let summaryAt = 0;
  const take = (c: Buffer) => {
    output += c.toString('utf8');
    if (summaryAt === 0 && /document\(s\) published/.test(output)) summaryAt = Date.now();
  };
  child.stdout.on('data', take);
  child.stderr.on('data', take);
  const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
  const killer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const code = await exited;
  clearTimeout(killer);
  return { code, output, summaryAt, exitedAt: Date.now() };
}

async function worker(processEnv: Record<string, string>): Promise<WorkerProcess> {
  const started = await startWorkerProcess(processEnv);
  defer(async () => void (await started.kill()));
  return started;
}

/**
 * The trace `traceId` as indented names, children in step order, then by name; a link to another trace is shown
 * as `-> <the linked span's name>`.
 */
function renderTrace(all: readonly DecodedSpan[], traceId: string): string {
  const spans = all.filter((s) => s.traceId === traceId);
  const order = (s: DecodedSpan) => {
    const step = stepNames().findIndex((name) => s.name.endsWith(`:${name}`));
    return step === -1 ? stepNames().length : step;
  };
  const ids = new Set(spans.map((s) => s.spanId));
  const lines: string[] = [];
  // A span whose parent is not in the trace (none, or one never exported) starts a line of its own.
  const walk = (parent: string | undefined, depth: number) => {
    const children = spans
      .filter((s) => (parent === undefined ? !ids.has(s.parentSpanId) : s.parentSpanId === parent))
      .sort((a, b) => order(a) - order(b) || a.name.localeCompare(b.name));
    for (const child of children) {
      const links = child.links
        .filter((l) => l.traceId !== traceId)
        .map((l) => ` -> ${all.find((s) => s.spanId === l.spanId)?.name ?? 'a span never received'}`);
      lines.push(`${'  '.repeat(depth)}${child.name}${links.join('')}`);
      walk(child.spanId, depth + 1);
    }
  };
  walk(undefined, 0);
  return lines.join('\n');
}

const DOCUMENT_TRACE = `StartWorkflow:documentPipeline -> StartChildWorkflow:documentPipeline
${DOCUMENT_SPANS_UNDER_START}`;

describe('traces through npm run pipeline and npm run worker, to a protobuf-only OTLP receiver', () => {
  it(
    'one trace per document, linked from the batch; no poll spans; the resource from OTEL_*',
    { timeout: 300_000 },
    async () => {
      const receiver = await startOtlpReceiver(python);
      defer(() => receiver.close());
      const publications = new SqlitePublicationStore(path.join(scratchDir(defer, 'otlp-pub-'), 'p.db'));
      defer(() => publications.close());
      const target = await startReceiver(publications, { scheduleSkewMs: Infinity });
      defer(() => target.close());

      const dataDir = scratchDir(defer, 'otlp-data-');
      const shared = {
        ...baseEnv(dataDir, `otlp-${randomUUID()}`),
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint,
        OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment=otlp-test,team=docs%20pipeline',
      };
      const count = 4;
      const traced = await worker({
        ...shared,
        OTEL_SERVICE_NAME: 'otlp-test-worker',
        PUBLISH_WEBHOOK_URL: target.url,
      });
      const run = await pipeline(documents(count), { ...shared, OTEL_SERVICE_NAME: 'otlp-test-cli' });
      assert.equal(run.code, 0, run.output);
      assert.match(run.output, new RegExp(`${count} of ${count} document\\(s\\) published, 0 failed`));
      assert.doesNotMatch(run.output, /Traces could not be exported/);

      // The worker exports on its processor's schedule (every 5 s): wait for the last step of every document.
      let spans: DecodedSpan[] = [];
      const deadline = Date.now() + 60_000;
      for (;;) {
        spans = await receiver.spans();
        const published = spans.filter((s) => s.name === 'publish POST').length;
        const runs = spans.filter((s) => s.name.startsWith('RunWorkflow:')).length;
        if (published >= count && runs >= count + 1) break;
        assert.ok(
          Date.now() < deadline,
          `the receiver has ${published} publish and ${runs} run span(s) of ${spans.map((s) => s.name).join(', ')}` +
            `\nworker:\n${traced.output()}\npipeline:\n${run.output}`,
        );
        await sleep(250);
      }

      const requests = await receiver.requests();
      assert.ok(requests.length > 0);
      for (const r of requests) assert.deepEqual([r.contentType, r.status], ['application/x-protobuf', 200]);

      const names = spans.map((s) => s.name);
      for (const polled of names.filter((n) => /^(QueryWorkflow|DescribeWorkflow|HandleQuery)/.test(n))) {
        assert.fail(`a poll was traced: ${polled}`);
      }

      for (const span of spans) {
        assert.equal(span.resource['deployment.environment'], 'otlp-test', span.name);
        assert.equal(span.resource.team, 'docs pipeline', span.name);
      }
      const service = (name: string) =>
        new Set(spans.filter((s) => s.name === name).map((s) => s.resource['service.name']));
      assert.deepEqual(service('StartWorkflow:batch'), new Set(['otlp-test-cli']));
      assert.deepEqual(service('RunWorkflow:documentPipeline'), new Set(['otlp-test-worker']));

      // One trace per document, each with its workflow and its steps.
      const documentRoots = spans.filter((s) => s.name === 'StartWorkflow:documentPipeline');
      assert.equal(documentRoots.length, count);
      const documentTraces = new Set(documentRoots.map((s) => s.traceId));
      assert.equal(documentTraces.size, count);
      for (const root of documentRoots) {
        assert.equal(root.parentSpanId, '', 'a document trace that is not a trace of its own');
        assert.equal(renderTrace(spans, root.traceId), DOCUMENT_TRACE);
      }

      // The batch's trace: its start, its run, and a link to each document's trace (and back).
      const batchStart = spans.find((s) => s.name === 'StartWorkflow:batch');
      assert.ok(batchStart);
      assert.ok(!documentTraces.has(batchStart.traceId));
      const batchTrace = renderTrace(spans, batchStart.traceId);
      const childStarts = spans.filter(
        (s) => s.traceId === batchStart.traceId && s.name === 'StartChildWorkflow:documentPipeline',
      );
      assert.equal(childStarts.length, count, batchTrace);
      const linked = new Set(childStarts.flatMap((s) => s.links.map((l) => l.traceId)));
      assert.deepEqual(linked, documentTraces, 'the batch does not link to each document trace');
      for (const root of documentRoots) {
        const back = root.links[0];
        assert.ok(back && childStarts.some((s) => s.spanId === back.spanId), 'a document does not link back');
      }
      const shown = documentRoots[0];
      assert.ok(shown);
      console.log(`batch trace, as the receiver decoded it:\n${batchTrace}`);
      console.log(`one document's trace, as the receiver decoded it:\n${renderTrace(spans, shown.traceId)}`);
      // Every span is in the batch's trace or in a document's: nothing else (no one-span traces for polls).
      const traces = new Set(spans.map((s) => s.traceId));
      assert.equal(traces.size, count + 1, `traces: ${traces.size}`);
      assert.ok(
        fs.readFileSync(SHOWN, 'utf8').includes(batchTrace),
        `docs/observability.md does not show:\n${batchTrace}`,
      );
    },
  );
});

describe('a review in the document trace', () => {
  it(
    'shows the wait for review as its own span, from the draft to the decision',
    { timeout: 300_000 },
    async () => {
      const receiver = await startOtlpReceiver(python);
      defer(() => receiver.close());
      const dataDir = scratchDir(defer, 'otlp-review-');
      const shared = {
        ...baseEnv(dataDir, `otlp-review-${randomUUID()}`),
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint,
      };
      await worker({ ...shared, OTEL_SERVICE_NAME: 'otlp-review-worker' });
      const run = await pipeline(documents(1), { ...shared, REVIEW: 'on' });
      assert.equal(run.code, 6, run.output);
      assert.match(run.output, /^AWAITING REVIEW /m, run.output);
      const { client, close } = await connectClient(loadConfig({ TEMPORAL_ADDRESS: env.address }));
      defer(close);
      let decided = false;
      for (const deadline = Date.now() + 60_000; !decided; await sleep(500)) {
        assert.ok(Date.now() < deadline, 'the draft never showed in the queue');
        for (const { workflowId } of await awaitingReview(client)) {
          const answer = await decide(client, workflowId, { action: 'approve', reviewer: 'ana' });
          decided ||= answer.ok;
        }
      }
      let review: DecodedSpan | undefined;
      for (const deadline = Date.now() + 60_000; review === undefined; await sleep(250)) {
        assert.ok(Date.now() < deadline, 'no Review span reached the receiver');
        review = (await receiver.spans()).find((s) => s.name === 'Review');
      }
      const spans = await receiver.spans();
      const parent = spans.find((s) => s.spanId === review.parentSpanId);
      assert.equal(parent?.name, 'RunWorkflow:documentPipeline');
      assert.equal(review.attributes.outcome, 'approved');
      assert.equal(review.attributes.reviewer, 'ana');
      // The decision's update is in the document's trace too (the SDK would start a trace of its own for it),
      // under the run's span, with its update ID.
      let handled: DecodedSpan | undefined;
      for (const deadline = Date.now() + 30_000; handled === undefined; await sleep(250)) {
        const all = await receiver.spans();
        handled = all.find((s) => s.name === 'HandleUpdate:review');
        assert.ok(
          handled !== undefined || Date.now() < deadline,
          `no HandleUpdate:review span reached the receiver: ${all.map((s) => s.name).join(', ')}`,
        );
      }
      const traced = await receiver.spans();
      assert.equal(handled.traceId, review.traceId, renderTrace(traced, review.traceId));
      assert.equal(handled.parentSpanId, parent?.spanId, renderTrace(traced, review.traceId));
      assert.ok(handled.attributes.temporalUpdateId, 'the update span has no update ID');
      assert.ok(
        traced.some((s) => s.name === 'ValidateUpdate:review' && s.traceId === review.traceId),
        renderTrace(traced, review.traceId),
      );
      console.log(`the reviewed document's trace:\n${renderTrace(traced, review.traceId)}`);
    },
  );
});

/** A collector on loopback that answers every request with `status`, or never answers (`'stall'`). */
async function brokenCollector(answer: number | 'stall'): Promise<string> {
  const server = http.createServer((req, res) => {
    req.resume();
    if (answer !== 'stall') req.on('end', () => res.writeHead(answer).end());
  });
  const url = await listenOnLoopback(server, 'broken collector');
  defer(() => {
    server.closeAllConnections();
    return closeServer(server);
  });
  return url;
}

describe('a collector that fails costs one log line, never the outcome or a slow exit', () => {
  let dataDir: string;
  let taskQueue: string;
  let dir: string;
  before(async () => {
    dataDir = scratchDir(defer, 'otlp-fail-');
    taskQueue = `otlp-fail-${randomUUID()}`;
    dir = documents(1);
    // An untraced worker: the command's exporter is the one under test.
    await worker(baseEnv(dataDir, taskQueue));
  });

  const cases: {
    name: string;
    collector: () => Promise<Record<string, string>>;
    /** What the one warning says; undefined: the collector works, and there is no warning. */
    reason: RegExp | undefined;
  }[] = [
    {
      name: 'is not configured (no tracing)',
      collector: () => Promise.resolve({}),
      reason: undefined,
    },
    {
      name: 'takes the spans',
      collector: async () => {
        const receiver = await startOtlpReceiver(python);
        defer(() => receiver.close());
        return { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint };
      },
      reason: undefined,
    },
    {
      name: 'answers 415 to OTLP/JSON (a protobuf-only collector)',
      collector: async () => {
        const receiver = await startOtlpReceiver(python);
        defer(() => receiver.close());
        return { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' };
      },
      reason: /HTTP 415/,
    },
    {
      name: 'refuses the connection',
      collector: async () => ({ OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${await freePort()}` }),
      reason: /ECONNREFUSED/,
    },
    {
      name: 'answers 503 to every retry',
      collector: async () => ({
        OTEL_EXPORTER_OTLP_ENDPOINT: await brokenCollector(503),
        OTEL_EXPORTER_OTLP_TIMEOUT: '60000',
      }),
      reason: /retryable|no answer within/,
    },
    {
      name: 'never answers',
      collector: async () => ({
        OTEL_EXPORTER_OTLP_ENDPOINT: await brokenCollector('stall'),
        OTEL_EXPORTER_OTLP_TIMEOUT: '60000',
      }),
      reason: /no answer within/,
    },
  ];
  for (const { name, collector, reason } of cases) {
    it(`npm run pipeline exits 0, and soon, when the collector ${name}`, { timeout: 240_000 }, async () => {
      const run = await pipeline(dir, { ...baseEnv(dataDir, taskQueue), ...(await collector()) });
      assert.equal(run.code, 0, run.output);
      assert.match(run.output, /1 of 1 document\(s\) (published|done earlier)/);
      const warnings = run.output.split('\n').filter((l) => l.includes('Traces could not be exported'));
      assert.equal(warnings.length, reason === undefined ? 0 : 1, run.output);
      if (reason !== undefined) assert.match(warnings[0] ?? '', reason);
      // With a 60 s export timeout, only the shutdown deadline can end the wait this early (slack: a busy machine).
      const lingered = run.exitedAt - run.summaryAt;
      console.log(`${name}: exited ${lingered} ms after the summary line`);
      assert.ok(lingered < SHUTDOWN_EXPORT_MS + 15_000, `exited ${lingered} ms after the summary`);
    });
  }
});

describe('the exporter that reports', () => {
  it(
    'says once that the collector failed, and once that it takes spans again',
    { timeout: 60_000 },
    async () => {
      const receiver = await startOtlpReceiver(python, { failFirst: 2 });
      defer(() => receiver.close());
      const lines: string[] = [];
      const stream = new Writable({
        write(chunk: Buffer, _encoding, done) {
          lines.push(...chunk.toString('utf8').split('\n').filter(Boolean));
          done();
        },
      });
      const log = createLogger({ stream, pretty: false });
      const url = `${receiver.endpoint}/v1/traces`;
      const exporter = new ReportingExporter(new ProtobufTraceExporter({ url }), url, () => log);
      const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
      defer(() => provider.shutdown());
      const tracer = provider.getTracer('otlp-test');
      // One span an export: two refused (500), then two taken.
      for (let i = 0; i < 4; i++) {
        tracer.startSpan(`span ${i}`).end();
        await until(async () => (await receiver.requests()).length > i, `export ${i + 1}`);
      }
      assert.deepEqual(
        (await receiver.requests()).map((r) => r.status),
        [500, 500, 200, 200],
      );
      assert.deepEqual(
        (await receiver.spans()).map((s) => s.name),
        ['span 2', 'span 3'],
      );
      const said = lines.map((l) => z.object({ level: z.string(), msg: z.string() }).parse(JSON.parse(l)));
      assert.equal(said.length, 2, lines.join('\n'));
      assert.equal(said[0]?.level, 'warn');
      assert.match(said[0]?.msg ?? '', /Traces could not be exported to .* \(HTTP 500/);
      assert.equal(said[1]?.level, 'info');
      assert.match(said[1]?.msg ?? '', /Traces reach .* again; 2 span\(s\) were lost meanwhile/);
    },
  );
});

/** Polls `check` every 50 ms until it holds; fails after 20 s. */
async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `timed out waiting for ${what}`);
    await sleep(50);
  }
}
