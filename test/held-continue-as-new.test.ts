/**
 * A held delivery outlasts its run's history: on the time-skipping server, a publish held for many looks with a
 * small history budget continues as new, keeps its idempotency key (the receiver and the ledger see one), never
 * runs summarize or tag again, shows held on the new run, keeps telling its parent, and completes once a settle
 * signal arrives right at the switch. A held run recorded by the code before the change still replays.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { bundleWorkflowCode, Worker } from '@temporalio/worker';
import type { WorkflowBundle } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { FailureType } from '../src/contract';
import type { PipelineContinuation, PipelineInput, PipelineProgress } from '../src/contract';
import type { PipelineResult } from '../src/cli/compose';
import { modelStepResults } from '../src/contract/plain';
import type { HeldNotice } from '../src/contract/plain';
import type { DeliveryLedger } from '../src/publisher/ledger';
import type { Publisher } from '../src/publisher/types';
import { OfflineModel } from '../src/model/offline-model';
import type { DocumentModel } from '../src/model/types';
import { createPipelineWorker } from '../src/temporal/worker';
import { deliverySettledSignal, progressQuery } from '../src/workflow';
import { documentPipeline } from '../workflows';
import {
  closeServer,
  installQuietRuntime,
  listenOnLoopback,
  pipelineInput,
  SAMPLE_TEXT,
  scratchLedger,
  silentLogger,
  tempParts,
  timeSkippingEnv,
  webhookPublisher,
  workflowBundle,
  workflowsWithWorkflowModule,
} from './helpers';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();
let env: TestWorkflowEnvironment;
let bundle: WorkflowBundle;

before(async () => {
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
  bundle = await bundleWorkflowCode({
    workflowsPath: require.resolve('./fixtures/held-parent'),
    logger: silentLogger,
  });
});

type HeldParent = (
  input: PipelineInput,
  continuation: PipelineContinuation,
) => Promise<{ result: PipelineResult; notices: HeldNotice[] }>;

/** A receiver that ignores keys and loses its answer to the first POST (after applying it); notes each key. */
async function lossyReceiver(): Promise<{ url: string; keys: string[] }> {
  const keys: string[] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      keys.push(String(req.headers['idempotency-key']));
      if (keys.length === 1) return void req.socket.destroy();
      res.writeHead(201, { 'content-type': 'application/json' }).end('{"revision": 1}');
    });
  });
  const origin = await listenOnLoopback(server);
  defer(() => closeServer(server));
  return { url: `${origin}/publications`, keys };
}

/** The ledger, noting every key a delivery was claimed or recorded under. */
function notingLedger(inner: DeliveryLedger, keys: Set<string>): DeliveryLedger {
  return new Proxy(inner, {
    get(target, property) {
      const value: unknown = Reflect.get(target, property);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]): unknown => {
        const [first] = args;
        if (property === 'claim' && typeof first === 'object' && first !== null && 'idempotencyKey' in first)
          keys.add(String(first.idempotencyKey));
        if (property === 'delivered' || property === 'retake') keys.add(String(first));
        return Reflect.apply(value, target, args);
      };
    },
  });
}

/** The offline model, counting its calls. */
function countingModel(calls: string[]): DocumentModel {
  const inner = new OfflineModel();
  return {
    info: inner.info,
    promptVersion: inner.promptVersion,
    ask: (request, text, call) => {
      calls.push(request.step);
      return inner.ask(request, text, call);
    },
  };
}

/** `promise`, or a failure naming what was seen when it takes longer than `ms`. */
async function withDeadline<T>(promise: Promise<T>, ms: number, seen: () => string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`still waiting after ${ms} ms; ${seen()}`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** One look at the held delivery: the run it came from, its key, and the run's history length then. */
interface Look {
  runId: string;
  key: string;
  historyLength: number;
  held: boolean;
}

describe('a held delivery across continue-as-new', () => {
  it(
    'continues as new, keeps its key, never reruns the model steps, and completes when settled at the switch',
    { timeout: 120_000 },
    async () => {
      const HISTORY_BUDGET = 60;
      const receiver = await lossyReceiver();
      const ledgerKeys = new Set<string>();
      const ledger = notingLedger(scratchLedger(defer), ledgerKeys);
      const inner = webhookPublisher(defer, receiver.url, { ledger, policy: 'hold', timeoutMs: 1_000 });
      const looks: Look[] = [];
      const progressOnNewRun: PipelineProgress[] = [];
      const runsBeforeSettling = 3;
      let settledIn: string | undefined;
      const workflowId = `held-${randomUUID()}`;
      const childId = `${workflowId}-doc`;
      const child = (runId?: string) => env.client.workflow.getHandle(childId, runId);

      // Settles the delivery (as `npm run deliveries -- resolve` does) during the last look of the third run:
      // its settle signal reaches the run as it decides to continue as new.
      const publisher: Publisher = {
        kind: inner.kind,
        async publish(publication, key, signal) {
          const runId = Context.current().info.workflowExecution?.runId ?? '';
          const { historyLength } = await child(runId).describe();
          const runs = new Set(looks.map((l) => l.runId));
          if (runs.size > 0 && !runs.has(runId))
            progressOnNewRun.push(await child(runId).query(progressQuery));
          try {
            const receipt = await inner.publish(publication, key, signal);
            looks.push({ runId, key, historyLength, held: false });
            return receipt;
          } catch (err) {
            const held = err instanceof ApplicationFailure && err.type === FailureType.DeliveryHeld;
            looks.push({ runId, key, historyLength, held });
            const runsNow = new Set(looks.map((l) => l.runId)).size;
            // A look adds ~11 events, a settle signal during it ~5 before the run decides: this is the run's last.
            const last = historyLength + 5 >= HISTORY_BUDGET;
            if (held && settledIn === undefined && runsNow >= runsBeforeSettling && last) {
              settledIn = runId;
              const claim = (await ledger.openClaims()).find((c) => c.idempotencyKey === key);
              assert.ok(claim !== undefined, `no open claim for ${key}`);
              const delivered = { documentId: publication.documentId, revision: 1, duplicate: true };
              assert.equal(await ledger.resolve(claim, { delivered }), true);
              await child().signal(deliverySettledSignal);
            }
            throw err;
          }
        },
      };
      const modelCalls: string[] = [];
      const local = await tempParts(defer, { publisher, model: countingModel(modelCalls) });
      const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
      const taskQueue = `held-can-${randomUUID()}`;
      const worker = await createPipelineWorker({
        connection: env.nativeConnection,
        namespace: env.namespace ?? 'default',
        taskQueue,
        deps: local.deps,
        workflowBundle: bundle,
      });

      const parent = await env.client.workflow.start<HeldParent>('heldParent', {
        taskQueue,
        workflowId,
        args: [input, { historyBudget: HISTORY_BUDGET }],
      });
      const { result, notices } = await worker.runUntil(
        withDeadline(parent.result(), 60_000, () => `looks: ${JSON.stringify(looks)}`),
      );

      const [first] = looks;
      assert.ok(first !== undefined && settledIn !== undefined, JSON.stringify(looks));
      const key = `${first.runId}:publish`;
      const runs = [...new Set(looks.map((l) => l.runId))];
      assert.ok(runs.length > runsBeforeSettling, `continued as new ${runs.length - 1} time(s)`);
      // One delivery, one key: every look, the one POST, the ledger and the result.
      assert.deepEqual([...new Set(looks.map((l) => l.key))], [key]);
      assert.deepEqual(receiver.keys, [key]);
      assert.deepEqual([...ledgerKeys], [key]);
      assert.equal(result.publication?.idempotencyKey, key);
      assert.equal(result.publication?.duplicate, true);
      // Summarize and tag ran once, in the first run; their results came along.
      assert.deepEqual(modelCalls.sort(), ['summarize', 'tag']);
      assert.deepEqual(
        modelStepResults(result).map((r) => r.idempotencyKey.split(':')[1]),
        ['summarize', 'tag'],
      );
      // Each new run shows the delivery held, the steps before it done.
      assert.equal(progressOnNewRun.length, runs.length - 1);
      for (const progress of progressOnNewRun)
        assert.deepEqual(
          { ...progress.steps, heldKey: progress.heldKey },
          {
            summarize: 'done',
            tag: 'done',
            publish: 'held',
            heldKey: key,
          },
        );
      // Settled during the last look of a run: the next run published at its first look, before any timer.
      const final = looks.at(-1);
      assert.ok(final !== undefined && !final.held);
      assert.notEqual(final.runId, settledIn);
      assert.deepEqual(
        looks.filter((l) => l.runId === final.runId),
        [final],
      );
      const finalEvents = (await child(final.runId).fetchHistory()).events ?? [];
      assert.equal(finalEvents.filter((e) => e.timerStartedEventAttributes).length, 0);
      // The parent heard the delivery held once (the key never changed) and, from the last run, that it went on.
      assert.deepEqual(notices, [{ workflowId: childId, heldKey: key }, { workflowId: childId }]);
    },
  );

  it(
    "replays, with today's code, a run held for longer than the budget under the code before the change",
    { timeout: 120_000 },
    async () => {
      const HISTORY_BUDGET = 60;
      const looks: Look[] = [];
      let settled = false;
      // A publisher that holds every delivery until told it arrived.
      const publisher: Publisher = {
        kind: 'webhook',
        publish(publication, key) {
          const runId = Context.current().info.workflowExecution?.runId ?? '';
          looks.push({ runId, key, historyLength: 0, held: !settled });
          if (settled)
            return Promise.resolve({ documentId: publication.documentId, revision: 1, duplicate: true });
          return Promise.reject(
            ApplicationFailure.create({
              type: FailureType.DeliveryHeld,
              nonRetryable: true,
              message: 'held for the test',
              details: [{ heldKey: key }],
            }),
          );
        },
      };
      const local = await tempParts(defer, { publisher });
      const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
      const taskQueue = `held-old-${randomUUID()}`;
      const handle = await env.client.workflow.start(documentPipeline, {
        taskQueue,
        workflowId: `held-old-${randomUUID()}`,
        args: [input, { historyBudget: HISTORY_BUDGET }],
      });
      // The code before the change: held for eight looks, its history past the budget, it never continues.
      const before = await createPipelineWorker({
        connection: env.nativeConnection,
        namespace: env.namespace ?? 'default',
        taskQueue,
        deps: local.deps,
        workflowBundle: await workflowsWithWorkflowModule(require.resolve('./fixtures/held-patch-absent')),
      });
      await before.runUntil(
        withDeadline(
          (async () => {
            // Waiting on the result lets the test server skip time through the waits.
            const done = handle.result();
            while (looks.length < 8) await new Promise((resolve) => setTimeout(resolve, 20));
            settled = true;
            await handle.signal(deliverySettledSignal);
            return done;
          })(),
          30_000,
          () => JSON.stringify(looks),
        ),
      );
      const history = await handle.fetchHistory();
      assert.ok((history.events ?? []).length > HISTORY_BUDGET);
      assert.equal((await handle.describe()).runId, handle.firstExecutionRunId);

      // Today's code replays it as it was recorded (it continues as new only past a patch marker).
      await Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, history, handle.workflowId);
      // Without the patch the same code would continue it as new where it waited: the replay check catches it.
      const unpatched = await workflowsWithWorkflowModule(require.resolve('./fixtures/patch-deleted'));
      await assert.rejects(
        Worker.runReplayHistory({ workflowBundle: unpatched }, history, handle.workflowId),
        DeterminismViolationError,
      );
    },
  );
});
