/**
 * The pipeline on a real dev server (`temporal server start-dev`), where what the time-skipping server cannot do
 * happens for real: start-to-close and heartbeat timeouts fire, worker processes are SIGKILLed and replaced, and
 * a completed run is reset. The model server and the publish target live in this test process, so what they
 * saw is evidence from outside the workers.
 */
import '../src/cli/compose';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { temporal } from '@temporalio/proto';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { FileBlobStore } from '../src/documents/blobs';
import { dataPaths } from '../src/config';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import { recoveryReport } from '../src/runs/history';
import { progressQuery } from '../src/workflow';
import type { documentPipeline } from '../workflows';

import type { WorkerProcess } from '../demo/worker-process';
import {
  CRASH_WORKER_DEFAULTS,
  devServerEnv,
  isTagRequest,
  modelServerFor,
  normalAnswer,
  openAIModel,
  pipelineInput,
  pipelineWorker,
  SAMPLE_TEXT,
  startCrashableWorker,
  startPipeline,
  tempParts,
  webhookPublisher,
  writeWorkflowBundle,
} from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';
import { startLink } from '../demo/link';
import type { LinkRequest } from '../demo/link';

type History = temporal.api.history.v1.IHistory;
type HistoryEvent = temporal.api.history.v1.IHistoryEvent;

let env: TestWorkflowEnvironment;
let bundlePath: string;
const defer = cleanupAfterAll();

before(async () => {
  // Timed-out and killed attempts are what these tests are about; the SDK logs each one as a warning.
  Runtime.install({ logger: new DefaultLogger('ERROR') });
  env = await devServerEnv();
  defer(() => env.teardown());
  bundlePath = await writeWorkflowBundle(scratchDir(defer, 'dev-server-bundle-'));
});

/** A worker process on the dev server, SIGKILLed after the file's tests if the test left it running. */
async function workerProcess(env_: Record<string, string>): Promise<WorkerProcess> {
  const worker = await startCrashableWorker({
    TEMPORAL_ADDRESS: env.address,
    TEMPORAL_NAMESPACE: env.namespace ?? 'default',
    WORKFLOW_BUNDLE_PATH: bundlePath,
    // Unset whatever the surrounding shell configured: each test chooses its model and target.
    MODEL: '',
    OPENAI_BASE_URL: '',
    OPENAI_MODEL: '',
    OPENAI_API_KEY: '',
    ...CRASH_WORKER_DEFAULTS,
    ...env_,
  });
  defer(async () => {
    if (worker.child.exitCode === null && worker.child.signalCode === null) await worker.kill();
  });
  return worker;
}

/** Polls until `check` returns a value, failing after `timeoutMs`. */
async function waitFor<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** The events of one activity (scheduled, started, completed...), found by its activity ID. */
function activityEvents(history: History, activityId: string) {
  const events = history.events ?? [];
  const scheduled = events.find((e) => e.activityTaskScheduledEventAttributes?.activityId === activityId);
  const belongs = (id: unknown): boolean =>
    scheduled?.eventId !== undefined && String(id) === String(scheduled.eventId);
  const find = (pick: (e: HistoryEvent) => unknown): HistoryEvent | undefined =>
    events.find((e) => belongs(pick(e)));
  return {
    scheduled,
    started: find((e) => e.activityTaskStartedEventAttributes?.scheduledEventId),
    completed: find((e) => e.activityTaskCompletedEventAttributes?.scheduledEventId),
  };
}

function scheduledAtOf(request: LinkRequest | undefined): number {
  const body: unknown = request === undefined ? undefined : JSON.parse(request.body.toString('utf8'));
  const value =
    typeof body === 'object' && body !== null && 'scheduledAt' in body ? body.scheduledAt : undefined;
  assert.equal(typeof value, 'number', `no scheduledAt in ${JSON.stringify(body)}`);
  return Number(value);
}

describe('documentPipeline on a real dev server', () => {
  it('retries a hung model call after its start-to-close timeout, under the same idempotency key', async () => {
    let summarizeCalls = 0;
    const server = await modelServerFor(defer, (request) =>
      !isTagRequest(request) && ++summarizeCalls === 1 ? 'hang' : normalAnswer(request),
    );
    // The client's own timeout is far away, so it is Temporal's start-to-close (3 s) that ends the first attempt.
    const model = openAIModel(server, { requestTimeoutMs: 60_000 });
    const local = await tempParts(defer, { model });
    const taskQueue = `test-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const handle = await startPipeline(
      env,
      taskQueue,
      await pipelineInput(local.blobs, SAMPLE_TEXT, { options: { modelTimeoutSeconds: 3 } }),
    );

    const { result, history } = await worker.runUntil(async () => ({
      result: await handle.result(),
      history: await handle.fetchHistory(),
    }));

    const runId = handle.firstExecutionRunId;
    assert.equal(result.summary.summary, 'Checkpoints let restarts skip finished steps.');
    assert.equal(result.publication?.revision, 1);
    assert.deepEqual(
      server.requests.filter((r) => !isTagRequest(r)).map((r) => r.idempotencyKey),
      [`${runId}:summarize`, `${runId}:summarize`],
    );
    const summarize = recoveryReport(history).steps.find((s) => s.step === 'summarize');
    assert.equal(summarize?.attempts, 2);
    assert.match(summarize?.lastFailure ?? '', /start.?to.?close/i);
  });

  it('finishes on a new worker after the first is killed once tag completed: summarize and tag ran exactly once', async () => {
    const server = await modelServerFor(defer, normalAnswer);
    const store = new SqlitePublicationStore(path.join(scratchDir(defer), 'publications.db'));
    defer(() => store.close());
    const receiver = await startReceiver(store);
    defer(() => receiver.close());
    // Publish cannot finish on worker 1: the gate holds its request until worker 1 is dead.
    let open = false;
    const gate = await startLink(receiver.url, { hold: () => !open });
    defer(() => gate.close());
    // Each worker has its own data folder (the document's text in each), so no memo of worker 1 could hide a
    // second model call by worker 2: the model server's count is the evidence.
    const dirs = [scratchDir(defer), scratchDir(defer)];
    const inputs = await Promise.all(
      dirs.map((dir) => pipelineInput(new FileBlobStore(dataPaths(dir).blobs), SAMPLE_TEXT)),
    );
    const input = inputs[0];
    assert.ok(input !== undefined);
    assert.equal(inputs[1]?.textRef, input.textRef);
    const taskQueue = `test-${randomUUID()}`;
    const workerEnv = (dir: string | undefined, identity: string): Record<string, string> => ({
      TEMPORAL_TASK_QUEUE: taskQueue,
      DATA_DIR: dir ?? '',
      OPENAI_BASE_URL: server.baseUrl,
      OPENAI_MODEL: 'test-model',
      PUBLISH_WEBHOOK_URL: gate.url,
      WORKER_IDENTITY: identity,
    });

    const worker1 = await workerProcess(workerEnv(dirs[0], 'worker-1'));
    const handle = await startPipeline(env, taskQueue, input);
    await waitFor('publish to reach the held webhook', async () => (gate.held.length > 0 ? true : undefined));
    const before = await handle.fetchHistory();
    assert.ok(activityEvents(before, 'tag').completed, 'tag is not recorded as completed');
    assert.equal(activityEvents(before, 'publish').completed, undefined, 'publish completed on worker 1');
    assert.deepEqual((await handle.query(progressQuery)).steps, {
      summarize: 'done',
      tag: 'done',
      publish: 'running',
    });
    assert.equal(await worker1.kill(), 'SIGKILL');

    open = true;
    const worker2 = await workerProcess(workerEnv(dirs[1], 'worker-2'));
    const result = await handle.result();
    const history = await handle.fetchHistory();

    const runId = handle.firstExecutionRunId;
    assert.equal(result.summary.summary, 'Checkpoints let restarts skip finished steps.');
    assert.deepEqual(result.tags.tags, ['checkpoints', 'idempotency']);
    assert.deepEqual(result.publication, {
      idempotencyKey: `${runId}:publish`,
      target: 'webhook',
      documentId: input.documentId,
      revision: 1,
      duplicate: false,
      receiverHonoursKey: true,
    });
    assert.deepEqual(
      server.requests.map((r) => [isTagRequest(r) ? 'tag' : 'summarize', r.idempotencyKey]).sort(),
      [
        ['summarize', `${runId}:summarize`],
        ['tag', `${runId}:tag`],
      ],
    );
    assert.equal(await store.countPublications(), 1);
    assert.deepEqual(await store.revisionsOf(input.documentId), [
      { revision: 1, idempotencyKey: `${runId}:publish` },
    ]);
    const workerOf = (id: string) =>
      activityEvents(history, id).started?.activityTaskStartedEventAttributes?.identity;
    assert.deepEqual(['summarize', 'tag', 'publish'].map(workerOf), [
      'worker-1',
      'worker-1',
      worker2.identity,
    ]);
  });

  it('leaves one publication, delivered under one key, when the worker dies between publish and completion', async () => {
    const local = await tempParts(defer);
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
    const taskQueue = `test-${randomUUID()}`;
    const common = { TEMPORAL_TASK_QUEUE: taskQueue, DATA_DIR: local.dir };

    const worker1 = await workerProcess({ ...common, CRASH_AFTER_PUBLISH: '1' });
    const handle = await startPipeline(env, taskQueue, input);
    assert.equal(await worker1.exited, 'SIGKILL');
    await workerProcess(common);
    const result = await handle.result();

    const key = `${handle.firstExecutionRunId}:publish`;
    assert.match(worker1.output(), new RegExp(`CRASH after publishing under ${key}`));
    assert.equal(result.publication?.idempotencyKey, key);
    assert.equal(result.publication?.revision, 1);
    assert.equal(result.publication?.duplicate, true);
    assert.equal(await local.store.countPublications(), 1);
    assert.deepEqual(await local.store.revisionsOf(input.documentId), [{ revision: 1, idempotencyKey: key }]);
    assert.deepEqual(
      (await local.store.deliveries()).map((d) => [d.documentId, d.idempotencyKey, d.outcome]),
      [
        [input.documentId, key, 'created'],
        [input.documentId, key, 'duplicate'],
      ],
    );
  });

  it('publishes revision 2 of the same document after a reset, under the new run ID', async () => {
    const local = await tempParts(defer);
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
    const taskQueue = `test-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const handle = await startPipeline(env, taskQueue, input);

    const { oldRun, newRun, result } = await worker.runUntil(async () => {
      await handle.result();
      // The workflow task that scheduled publish: it followed the completion of both model steps (tag's last).
      const publish = activityEvents(await handle.fetchHistory(), 'publish').scheduled;
      const resetPoint = publish?.activityTaskScheduledEventAttributes?.workflowTaskCompletedEventId;
      assert.ok(resetPoint, 'no publish step in the history');
      const { runId } = await env.client.workflowService.resetWorkflowExecution({
        namespace: env.namespace ?? 'default',
        workflowExecution: { workflowId: handle.workflowId, runId: handle.firstExecutionRunId },
        workflowTaskFinishEventId: resetPoint,
        reason: 'test: redo publish',
        requestId: randomUUID(),
      });
      assert.ok(runId, 'the reset returned no run ID');
      const reset = env.client.workflow.getHandle<typeof documentPipeline>(handle.workflowId, runId);
      return { oldRun: handle.firstExecutionRunId, newRun: runId, result: await reset.result() };
    });

    assert.notEqual(newRun, oldRun);
    // The model steps were not run again: their results (and keys) come from the original run's history.
    assert.equal(result.summary.idempotencyKey, `${oldRun}:summarize`);
    assert.equal(result.tags.idempotencyKey, `${oldRun}:tag`);
    assert.equal(result.publication?.idempotencyKey, `${newRun}:publish`);
    assert.equal(result.publication?.revision, 2);
    assert.equal(result.publication?.duplicate, false);
    assert.equal(await local.store.countPublications(), 1);
    assert.deepEqual(await local.store.revisionsOf(input.documentId), [
      { revision: 1, idempotencyKey: `${oldRun}:publish` },
      { revision: 2, idempotencyKey: `${newRun}:publish` },
    ]);
  });

  it('does not let a late publish from the run a reset replaced overwrite the reset run’s publication', async () => {
    const store = new SqlitePublicationStore(path.join(scratchDir(defer), 'publications.db'));
    defer(() => store.close());
    const receiver = await startReceiver(store);
    defer(() => receiver.close());
    // The first run's publish request is held in flight; the reset run's passes straight to the receiver.
    let heldKey: string | undefined;
    const gate = await startLink(receiver.url, {
      hold: ({ key }) => (heldKey ??= key) === key,
    });
    defer(() => gate.close());
    const local = await tempParts(defer, {
      publisher: webhookPublisher(defer, gate.url, { timeoutMs: 60_000 }),
    });
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
    const taskQueue = `test-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const handle = await startPipeline(env, taskQueue, input);

    const { oldRun, newRun, result } = await worker.runUntil(async () => {
      await waitFor('the first run’s publish to reach the gate', async () =>
        gate.held.length > 0 ? true : undefined,
      );
      const publish = activityEvents(await handle.fetchHistory(), 'publish');
      assert.equal(publish.completed, undefined, 'the first run’s publish completed');
      const resetPoint =
        publish.scheduled?.activityTaskScheduledEventAttributes?.workflowTaskCompletedEventId;
      assert.ok(resetPoint, 'no publish step in the history');
      // The operator resets the stuck run: the server terminates it and redoes publish in a new run.
      const { runId } = await env.client.workflowService.resetWorkflowExecution({
        namespace: env.namespace ?? 'default',
        workflowExecution: { workflowId: handle.workflowId, runId: handle.firstExecutionRunId },
        workflowTaskFinishEventId: resetPoint,
        reason: 'test: redo a stuck publish',
        requestId: randomUUID(),
      });
      assert.ok(runId, 'the reset returned no run ID');
      const reset = env.client.workflow.getHandle<typeof documentPipeline>(handle.workflowId, runId);
      return { oldRun: handle.firstExecutionRunId, newRun: runId, result: await reset.result() };
    });
    // Only now does the replaced run's publication reach the target, under a key it has never seen.
    const late = (await gate.release()).map(({ status, body }) => ({
      status,
      body: JSON.parse(body) as unknown,
    }));

    assert.notEqual(newRun, oldRun);
    assert.deepEqual(result.publication, {
      idempotencyKey: `${newRun}:publish`,
      target: 'webhook',
      documentId: input.documentId,
      revision: 1,
      duplicate: false,
      receiverHonoursKey: true,
    });
    assert.ok(gate.held.every((r) => r.key === `${oldRun}:publish`));
    assert.ok(
      scheduledAtOf(gate.held[0]) < scheduledAtOf(gate.passed[0]),
      'the reset run did not schedule its publish later than the run it replaced',
    );
    assert.ok(late.length > 0);
    for (const answer of late) {
      assert.deepEqual(answer, {
        status: 200,
        body: { documentId: input.documentId, revision: 1, duplicate: false, superseded: true },
      });
    }
    assert.deepEqual(await store.revisionsOf(input.documentId), [
      { revision: 1, idempotencyKey: `${newRun}:publish` },
    ]);
    assert.equal((await store.currentPublication(input.documentId))?.revision, 1);
    assert.deepEqual(
      (await store.deliveries()).map((d) => [d.idempotencyKey, d.outcome]),
      [[`${newRun}:publish`, 'created'], ...late.map(() => [`${oldRun}:publish`, 'stale'])],
    );
  });
});
