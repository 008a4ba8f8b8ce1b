/**
 * Logs as data, quiet by default. In this process the Temporal Runtime logs through the pipeline's logger (JSON
 * lines into memory) while real runs go through the time-skipping server: every line about a run carries its
 * workflow and run IDs, and a retried failure is one line with its reason and next attempt (the stack only at
 * debug). Entry points run as real processes with pipes, not terminals: no colour codes, one friendly line when no
 * server answers, and a SIGTERM that ends `npm start` without a stack.
 */
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { Writable } from 'node:stream';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { ApplicationFailure } from '@temporalio/common';
import { Runtime } from '@temporalio/worker';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Registry } from 'prom-client';
import { nextAttempt } from '../src/telemetry/attempts';
import { createLogger, SdkLogger } from '../src/telemetry/log';
import { pipelineMetrics } from '../src/telemetry/metrics';
import {
  closeServer,
  finishedRun,
  listenOnLoopback,
  pipelineInput,
  SAMPLE_TEXT,
  tempParts,
  timeSkippingEnv,
  webhookPublisher,
  withPipeline,
} from './helpers';
import { cleanupAfterAll, freePort, scratchDir } from './scratch';

const ROOT = path.resolve(__dirname, '..');
const defer = cleanupAfterAll();

/** Every line the SDK and the activities logged in this process, parsed. */
const lines: Record<string, unknown>[] = [];
const memory = new Writable({
  write(chunk: Buffer, _encoding, done) {
    for (const line of chunk.toString('utf8').split('\n')) if (line !== '') lines.push(JSON.parse(line));
    done();
  },
});
const log = createLogger({ level: 'info', stream: memory });
Runtime.install({
  logger: new SdkLogger(log),
  telemetryOptions: { logging: { filter: { core: 'WARN', other: 'ERROR' }, forward: {} } },
});

let env: TestWorkflowEnvironment;
before(async () => {
  env = await timeSkippingEnv(defer);
});

/** The lines logged while `run` ran, at `level`. */
async function logged(level: 'info' | 'debug', run: () => Promise<void>): Promise<Record<string, unknown>[]> {
  const from = lines.length;
  log.level = level;
  try {
    await run();
  } finally {
    log.level = 'info';
  }
  return lines.slice(from);
}

/**
 * A webhook that answers 503 with `Retry-After: 1` to its first `failures` POSTs, then takes the publication. (The
 * time-skipping server does not send activities their retry policy, so the failure's own delay is what dates the
 * next attempt here; nextAttempt's unit tests cover the policy's backoff.)
 */
async function flakyWebhook(failures: number): Promise<string> {
  let posts = 0;
  const server = http.createServer((req, res) => {
    req.resume().on('end', () => {
      posts += 1;
      if (posts <= failures)
        res.writeHead(503, { 'content-type': 'text/plain', 'retry-after': '1' }).end('down for maintenance');
      else res.writeHead(200, { 'content-type': 'application/json' }).end('{"revision": 1}');
    });
  });
  const url = await listenOnLoopback(server, 'flaky webhook');
  defer(() => closeServer(server));
  return url;
}

/** A run of the pipeline whose publish fails twice with 503; its metrics and its run ID. */
async function runWithFlakyPublish() {
  const metrics = new Registry();
  // A 503 proves nothing (the claim stays open): the receiver behind dedupes, so the retry sends it again.
  const publisher = webhookPublisher(defer, await flakyWebhook(2), { policy: 'resend' });
  const local = await tempParts(defer, { publisher });
  const deps = { ...local.deps, metrics: pipelineMetrics(metrics) };
  const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
  const { runId } = await withPipeline(env, { ...local, deps }, input, finishedRun);
  return { runId, metrics: await metrics.metrics() };
}

describe('the logs of a run', () => {
  it('are JSON lines, and every line about the run carries its workflow and run IDs', async () => {
    let runId = '';
    let workflowId = '';
    const got = await logged('debug', async () => {
      const local = await tempParts(defer);
      const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
      await withPipeline(env, local, input, async (handle) => {
        workflowId = handle.workflowId;
        runId = (await finishedRun(handle)).runId;
      });
    });
    const mine = got.filter((l) => l.workflowId === workflowId);
    const from = (component: string) => mine.filter((l) => l.sdkComponent === component).map((l) => l.msg);
    assert.ok(
      mine.some((l) => l.msg === 'Workflow completed'),
      'no line from the workflow sandbox',
    );
    assert.ok(from('worker').includes('Activity completed'), 'no line from an activity');
    for (const line of mine) {
      assert.equal(line.runId, runId, `a line without its run ID: ${JSON.stringify(line)}`);
      assert.equal(line.taskToken, undefined);
    }
    // Lines of the run's activities and workflow that lack the workflow ID would not be in `mine`.
    const unattributed = got.filter(
      (l) => (l.activityId !== undefined || l.workflowType !== undefined) && l.workflowId === undefined,
    );
    assert.deepEqual(unattributed, []);
  });

  it('give a retried failure one line with its reason and the next attempt, the stack only at debug', async () => {
    let run = { runId: '', metrics: '' };
    const quiet = await logged('info', async () => void (run = await runWithFlakyPublish()));
    const failures = quiet.filter((l) => l.runId === run.runId && l.level !== 'info');
    const shape =
      /^publish attempt (\d) failed: publish webhook at http:\/\/127\.0\.0\.1:\d+ answered HTTP 503; Retry-After 1 s: down for maintenance; next attempt at (\S+) \(in (\d+) s\)$/;
    assert.deepEqual(
      failures.map((l) => {
        const [, attempt, at, delay] = shape.exec(String(l.msg)) ?? [];
        assert.equal(at, l.nextAttemptAt, `the line does not say the next attempt's time: ${String(l.msg)}`);
        return [l.level, attempt, delay];
      }),
      [
        ['warn', '1', '1'],
        ['warn', '2', '1'],
      ],
      JSON.stringify(failures, null, 2),
    );
    for (const line of failures) {
      assert.equal(line.errorType, 'TransientPublishError');
      assert.match(String(line.nextAttemptAt), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.equal(line.stack, undefined, 'a stack trace at LOG_LEVEL=info');
    }
    assert.ok(!JSON.stringify(quiet).includes('\\n    at '), 'a stack trace at LOG_LEVEL=info');
    assert.match(run.metrics, /^pipeline_step_reruns_total\{step="publish"\} 2$/m);
    assert.match(run.metrics, /^pipeline_step_failures_total\{step="publish",retried="true"\} 2$/m);
    assert.match(run.metrics, /^pipeline_publications_total\{outcome="failed"\} 2$/m);
    assert.match(run.metrics, /^pipeline_publications_total\{outcome="published"\} 1$/m);

    const verbose = await logged('debug', async () => void (run = await runWithFlakyPublish()));
    const withStacks = verbose.filter((l) => l.runId === run.runId && /^publish attempt/.test(String(l.msg)));
    assert.equal(withStacks.length, 2);
    for (const line of withStacks) assert.match(String(line.stack), /\n {4}at /);
  });
});

/** Runs an entry point under node with pipes (not a terminal); `whenOutput` may act on what it prints. */
function runEntryPoint(
  script: string,
  args: string[],
  envVars: Record<string, string>,
  whenOutput: (output: string, child: ReturnType<typeof spawn>) => void = () => {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, script), ...args], {
    cwd: ROOT,
    env: { ...process.env, LOG_LEVEL: 'info', ...envVars },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => {
    stdout += c.toString('utf8');
    whenOutput(stdout + stderr, child);
  });
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
  defer(() => void child.kill('SIGKILL'));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
}

describe('entry points, not on a terminal', () => {
  it('npm run worker with no server: one friendly line, exit code 1, no stack, no colour codes', async () => {
    const address = `127.0.0.1:${await freePort()}`;
    const { code, stdout, stderr } = await runEntryPoint('src/cli/worker.ts', [], {
      TEMPORAL_ADDRESS: address,
    });
    assert.equal(code, 1);
    const output = stdout + stderr;
    assert.ok(!output.includes('\x1b['), `colour codes in:\n${output}`);
    assert.doesNotMatch(output, /TransportError|\n\s+at /);
    const logLines = stderr.trim().split('\n');
    assert.equal(logLines.length, 1, stderr);
    const line = JSON.parse(logLines[0] ?? '') as Record<string, unknown>;
    assert.equal(line.level, 'error');
    assert.equal(
      line.msg,
      `No Temporal server answers at ${address} (Connection refused): start one with ` +
        '`npm run server` (the embedded server, until Ctrl-C), or set TEMPORAL_ADDRESS',
    );
  });

  it('npm start stopped by SIGTERM mid-run: says so in one line, no PromiseCompletionTimeoutError', async () => {
    const dir = scratchDir(defer, 'sigterm-');
    const doc = path.join(dir, 'note.md');
    fs.writeFileSync(doc, SAMPLE_TEXT);
    let signalled = false;
    const { code, stdout, stderr } = await runEntryPoint(
      'src/cli/start.ts',
      [doc],
      { TEMPORAL_ADDRESS: env.address, DATA_DIR: dir, OFFLINE_MODEL_LATENCY_MS: '2000' },
      (output, child) => {
        if (!signalled && /^Worker \S+: model/m.test(output)) {
          signalled = true;
          child.kill('SIGTERM');
        }
      },
    );
    const output = stdout + stderr;
    assert.ok(signalled, `npm start never got its worker going:\n${output}`);
    assert.equal(code, 1, output);
    assert.ok(!output.includes('\x1b['), `colour codes in:\n${output}`);
    assert.doesNotMatch(output, /PromiseCompletionTimeoutError|\n\s+at /);
    const logLines = stderr
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.deepEqual(
      logLines.filter((l) => l.level === 'error'),
      [],
    );
    assert.equal(
      logLines.at(-1)?.msg,
      'Stopped by a signal before the work was done; run the same command again to resume',
    );
  });
});

describe('nextAttempt', () => {
  const policy = { initialInterval: 5_000, backoffCoefficient: 2, maximumInterval: 600_000 };
  const attempt = (n: number, err: unknown, overrides: object = {}) =>
    nextAttempt(
      { attempt: n, retryPolicy: policy, scheduledTimestampMs: 0, scheduleToCloseTimeoutMs: 0, ...overrides },
      err,
      1_000_000,
    );
  const transient = ApplicationFailure.create({ type: 'TransientPublishError', message: 'HTTP 503' });
  const inMs = (next: ReturnType<typeof nextAttempt>) => (next.retried && next.at ? next.inMs : undefined);

  it("follows the policy's backoff up to its maximum interval", () => {
    assert.equal(inMs(attempt(1, transient)), 5_000);
    assert.equal(inMs(attempt(3, transient)), 20_000);
    assert.equal(inMs(attempt(20, transient)), 600_000);
    assert.deepEqual(attempt(1, transient), { retried: true, at: new Date(1_005_000), inMs: 5_000 });
  });

  it("takes the failure's own delay (a Retry-After) over the backoff", () => {
    const later = ApplicationFailure.create({ message: '429', nextRetryDelay: '42 seconds' });
    assert.equal(inMs(attempt(4, later)), 42_000);
  });

  it('says why a failure is not retried: non-retryable, its type listed, attempts used, budget over', () => {
    const fatal = ApplicationFailure.create({ type: 'PublishRejected', message: '400', nonRetryable: true });
    assert.deepEqual(attempt(1, fatal), { retried: false, why: 'non-retryable' });
    const refused = ApplicationFailure.create({ type: 'PayloadRefused', message: 'plaintext' });
    assert.deepEqual(
      attempt(1, refused, { retryPolicy: { ...policy, nonRetryableErrorTypes: ['PayloadRefused'] } }),
      {
        retried: false,
        why: 'non-retryable PayloadRefused',
      },
    );
    assert.deepEqual(attempt(3, transient, { retryPolicy: { ...policy, maximumAttempts: 3 } }), {
      retried: false,
      why: 'all 3 attempts used',
    });
    const budget = attempt(2, transient, { scheduledTimestampMs: 0, scheduleToCloseTimeoutMs: 1_005_000 });
    assert.equal(budget.retried, false);
  });

  it('claims no time when the server sent no policy and the failure no delay', () => {
    assert.deepEqual(attempt(1, transient, { retryPolicy: undefined }), { retried: true, at: undefined });
  });
});
