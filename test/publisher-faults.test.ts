/**
 * Publisher faults through real runs on the time-skipping server: the webhook publisher talks to a real receiver
 * (startReceiver over a PublicationStore) through a proxy in this file that injects the fault. Whatever the fault,
 * every delivery of a run carries one key and the store holds at most one publication for it.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { ActivityFailure, ApplicationFailure, RetryState } from '@temporalio/common';
import { WorkflowFailedError } from '@temporalio/client';
import { tsToMs } from '@temporalio/common/lib/time';
import type { temporal } from '@temporalio/proto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import { FailureType } from '../src/contract';
import type { PipelineInput } from '../src/contract';
import type { Publisher } from '../src/publisher/types';
import {
  closeServer,
  finishedRun,
  installQuietRuntime,
  listenOnLoopback,
  pipelineInput,
  SAMPLE_TEXT,
  scratchLedger,
  tempParts,
  timeSkippingEnv,
  withPipeline,
  webhookPublisher,
} from './helpers';
import { cleanupAfterAll, tempDir } from './scratch';
import { relay } from '../demo/link';
import { openClaimOf } from './helpers';
import type { StartedPipeline } from './helpers';
import { deliverySettledSignal, progressQuery } from '../src/workflow';

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();

before(async () => {
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
});

/** What the proxy does with one delivery. */
type Fault =
  | { kind: 'forward' }
  | { kind: 'answer'; status: number; body: unknown; headers?: Record<string, string> }
  /** Forwards (the receiver commits), then holds the receiver's answer for `ms`: past the publisher's timeout. */
  | { kind: 'forward-then-delay'; ms: number }
  /** Forwards (the receiver commits), then resets the connection instead of answering. */
  | { kind: 'forward-then-reset' };

interface Delivery {
  idempotencyKey: string | undefined;
  fault: Fault['kind'];
  /** Status the publisher was sent, or undefined when it never got an answer. */
  answered: number | undefined;
  /** The publisher hung up before the proxy answered. */
  abandoned: boolean;
}

/** A receiver and its store in a temp folder, behind a proxy that applies `script` to delivery n (from 1). */
async function faultyWebhook(script: (n: number) => Fault) {
  const dir = tempDir('publisher-faults-');
  const store = new SqlitePublicationStore(path.join(dir, 'receiver.db'));
  // Workflow time on the time-skipping server runs ahead of the wall clock the receiver bounds scheduledAt by.
  const receiver = await startReceiver(store, { scheduleSkewMs: Infinity });
  const deliveries: Delivery[] = [];

  const proxy = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const key = req.headers['idempotency-key'];
      const fault = script(deliveries.length + 1);
      const delivery: Delivery = {
        idempotencyKey: typeof key === 'string' ? key : undefined,
        fault: fault.kind,
        answered: undefined,
        abandoned: false,
      };
      deliveries.push(delivery);
      res.on('close', () => {
        if (!res.writableFinished) delivery.abandoned = true;
      });
      const send = (status: number, body: string, headers: Record<string, string> = {}): void => {
        if (res.destroyed) return;
        delivery.answered = status;
        res.writeHead(status, { 'content-type': 'application/json', ...headers });
        res.end(body);
      };
      const act = async (): Promise<void> => {
        if (fault.kind === 'answer') return send(fault.status, JSON.stringify(fault.body), fault.headers);
        const answer = await relay(receiver.url, {
          key: typeof key === 'string' ? key : undefined,
          body: Buffer.concat(chunks),
        });
        if (fault.kind === 'forward-then-delay')
          await new Promise((resolve) => setTimeout(resolve, fault.ms));
        if (fault.kind === 'forward-then-reset') {
          req.socket.destroy();
          return;
        }
        send(
          answer.status,
          answer.body,
          answer.echoedKey === null ? {} : { 'idempotency-key': answer.echoedKey },
        );
      };
      act().catch((err: unknown) => send(599, JSON.stringify({ error: `proxy: ${String(err)}` })));
    });
  });
  const origin = await listenOnLoopback(proxy, 'proxy');

  defer(async () => {
    await closeServer(proxy);
    await receiver.close();
    await store.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { url: `${origin}/publications`, store, deliveries };
}

/**
 * The webhook publisher, recording what each attempt threw. (The time-skipping server does not record an
 * attempt's last failure in the history, so the test keeps its own.)
 */
function recordingWebhook(
  url: string,
  timeoutMs: number,
  policy: 'auto' | 'resend' | 'hold',
): { publisher: Publisher; errors: string[] } {
  const inner = webhookPublisher(defer, url, { timeoutMs, policy });
  const errors: string[] = [];
  const publisher: Publisher = {
    kind: inner.kind,
    publish: (publication, key, signal) =>
      inner.publish(publication, key, signal).catch((err: unknown) => {
        errors.push(err instanceof Error ? err.message : String(err));
        throw err;
      }),
  };
  return { publisher, errors };
}

/**
 * Runs the pipeline with the offline model and a webhook publisher to `url`, on a fresh task queue. `policy` is
 * OPEN_DELIVERY_POLICY: `resend` where the test's receiver is known to dedupe before it had a chance to echo.
 */
async function withWebhookPipeline<T>(
  url: string,
  timeoutMs: number,
  use: (handle: StartedPipeline, input: PipelineInput, publishErrors: string[]) => Promise<T>,
  policy: 'auto' | 'resend' | 'hold' = 'auto',
): Promise<T> {
  const { publisher, errors } = recordingWebhook(url, timeoutMs, policy);
  const local = await tempParts(defer, { publisher });
  const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
  return withPipeline(env, local, input, (handle) => use(handle, input, errors), {
    taskQueuePrefix: 'publisher-faults-',
  });
}

/** Waits for the run to finish: its result, run ID and history, with the input and the publish errors. */
async function finishedWebhookRun(handle: StartedPipeline, input: PipelineInput, errors: string[]) {
  return { ...(await finishedRun(handle)), input, errors };
}

/** The publish step as the history recorded it: the final attempt's number, and server time from schedule to end. */
function publishStep(history: temporal.api.history.v1.IHistory) {
  const events = history.events ?? [];
  const scheduled = events.find((e) => e.activityTaskScheduledEventAttributes?.activityId === 'publish');
  assert.ok(scheduled?.eventId, 'publish was never scheduled');
  const ofPublish = (id: unknown) => String(id) === String(scheduled.eventId);
  const started = events.find((e) => ofPublish(e.activityTaskStartedEventAttributes?.scheduledEventId));
  const completed = events.find((e) => ofPublish(e.activityTaskCompletedEventAttributes?.scheduledEventId));
  assert.ok(started?.activityTaskStartedEventAttributes && completed, 'publish did not complete');
  return {
    attempt: started.activityTaskStartedEventAttributes.attempt,
    ms: tsToMs(completed.eventTime) - tsToMs(scheduled.eventTime),
  };
}

describe('publisher faults through real runs on the time-skipping server', () => {
  it('503 (Retry-After 120) then 2xx from a receiver that dedupes: one publication, both deliveries under one key, the retry waited 120 s', async () => {
    const webhook = await faultyWebhook((n) =>
      n === 1
        ? {
            kind: 'answer',
            status: 503,
            body: { error: 'down for maintenance' },
            headers: { 'retry-after': '120' },
          }
        : { kind: 'forward' },
    );
    // A 503 proves nothing (a gateway may answer it for an origin that applied the POST): only the policy that
    // trusts the receiver to dedupe sends it again.
    const { result, runId, history, input, errors } = await withWebhookPipeline(
      webhook.url,
      5_000,
      finishedWebhookRun,
      'resend',
    );
    const key = `${runId}:publish`;
    assert.deepEqual(result.publication, {
      idempotencyKey: key,
      target: 'webhook',
      documentId: input.documentId,
      revision: 1,
      duplicate: false,
      receiverHonoursKey: true,
    });
    assert.deepEqual(
      webhook.deliveries.map((d) => [d.idempotencyKey, d.answered]),
      [
        [key, 503],
        [key, 201],
      ],
    );
    assert.equal(await webhook.store.countPublications(), 1);
    assert.deepEqual(await webhook.store.revisionsOf(input.documentId), [
      { revision: 1, idempotencyKey: key },
    ]);
    const step = publishStep(history);
    assert.equal(step.attempt, 2);
    assert.equal(errors.length, 1);
    assert.match(errors[0] ?? '', /HTTP 503; Retry-After 120 s: .*down for maintenance/);
    // The policy alone would have retried after 5 s; the receiver asked for 120.
    assert.ok(step.ms >= 120_000, `the retry came after ${step.ms} ms`);
  });

  it('422 with a JSON error fails without retry, quoting the body: one delivery, nothing stored', async () => {
    const webhook = await faultyWebhook(() => ({
      kind: 'answer',
      status: 422,
      body: { error: 'summary mentions a competitor', field: 'summary' },
    }));
    await withWebhookPipeline(webhook.url, 5_000, (handle) =>
      assert.rejects(handle.result(), (err) => {
        assert.ok(err instanceof WorkflowFailedError, `expected WorkflowFailedError, got ${String(err)}`);
        assert.ok(err.cause instanceof ActivityFailure, `expected ActivityFailure, got ${String(err.cause)}`);
        assert.equal(err.cause.activityId, 'publish');
        assert.equal(err.cause.retryState, RetryState.NON_RETRYABLE_FAILURE);
        const failure = err.cause.cause;
        assert.ok(
          failure instanceof ApplicationFailure,
          `expected ApplicationFailure, got ${String(failure)}`,
        );
        assert.equal(failure.type, FailureType.PublishRejected);
        assert.equal(failure.nonRetryable, true);
        assert.match(failure.message, /HTTP 422/);
        assert.ok(
          failure.message.includes('{"error":"summary mentions a competitor","field":"summary"}'),
          failure.message,
        );
        assert.match(failure.message, /Retrying cannot fix a 4xx/);
        return true;
      }),
    );
    assert.equal(webhook.deliveries.length, 1);
    assert.equal(await webhook.store.countPublications(), 0);
  });

  const lostAnswers: Array<{ name: string; fault: Fault; lastFailure: RegExp }> = [
    {
      name: 'a webhook that commits, then answers after the 500 ms timeout',
      fault: { kind: 'forward-then-delay', ms: 1_500 },
      lastFailure: /publish webhook at .*: no answer within 500 ms$/,
    },
    {
      name: 'a webhook that commits, then resets the connection',
      fault: { kind: 'forward-then-reset' },
      lastFailure: /publish webhook at .*: request failed/,
    },
  ];
  for (const { name, fault, lastFailure } of lostAnswers) {
    it(`${name}: sent again under the same key to a receiver that dedupes, the store keeps one publication and the retry gets "duplicate"`, async () => {
      const webhook = await faultyWebhook((n) => (n === 1 ? fault : { kind: 'forward' }));
      const { result, runId, history, input, errors } = await withWebhookPipeline(
        webhook.url,
        500,
        finishedWebhookRun,
        'resend',
      );
      const key = `${runId}:publish`;
      assert.deepEqual(result.publication, {
        idempotencyKey: key,
        target: 'webhook',
        documentId: input.documentId,
        revision: 1,
        duplicate: true,
        receiverHonoursKey: true,
      });
      assert.equal(webhook.deliveries.length, 2);
      assert.ok(
        webhook.deliveries.every((d) => d.idempotencyKey === key),
        'a retry used another key',
      );
      assert.equal(webhook.deliveries[0]?.abandoned, true, 'the first answer reached the publisher');
      assert.equal(webhook.deliveries[1]?.answered, 200);
      assert.equal(await webhook.store.countPublications(), 1);
      assert.deepEqual(await webhook.store.revisionsOf(input.documentId), [
        { revision: 1, idempotencyKey: key },
      ]);
      assert.deepEqual(
        (await webhook.store.deliveries()).map((d) => [d.idempotencyKey, d.outcome]),
        [
          [key, 'created'],
          [key, 'duplicate'],
        ],
      );
      const step = publishStep(history);
      assert.equal(step.attempt, 2);
      assert.equal(errors.length, 1);
      assert.match(errors[0] ?? '', lastFailure);
    });
  }

  it('a held delivery is shown held, outlasts the step budget, and finishes once settled, without a second POST', async () => {
    const webhook = await faultyWebhook((n) =>
      n === 1 ? { kind: 'forward-then-reset' } : { kind: 'forward' },
    );
    const ledger = scratchLedger(defer);
    const publisher = webhookPublisher(defer, webhook.url, { timeoutMs: 500, policy: 'hold', ledger });
    const local = await tempParts(defer, { publisher });
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT, { options: { stepBudgetMinutes: 1 } });
    await withPipeline(env, local, input, async (handle) => {
      const key = `${handle.firstExecutionRunId}:publish`;
      const deadline = Date.now() + 60_000;
      for (;;) {
        const progress = await handle.query(progressQuery);
        if (progress.steps.publish === 'held') {
          assert.equal(progress.heldKey, key);
          break;
        }
        assert.ok(Date.now() < deadline, `never held: ${JSON.stringify(progress)}`);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      // Three times the step's budget: a held delivery waits for its verdict, not for the budget to run out.
      await env.sleep('3 minutes');
      assert.equal((await handle.describe()).status.name, 'RUNNING');
      assert.equal((await handle.query(progressQuery)).steps.publish, 'held');

      assert.equal(
        await ledger.resolve(await openClaimOf(ledger, key), {
          delivered: { documentId: input.documentId, revision: 1, duplicate: true },
        }),
        true,
      );
      await handle.signal(deliverySettledSignal);
      const result = await handle.result();
      assert.deepEqual([result.publication?.revision, result.publication?.duplicate], [1, true]);
    });
    assert.equal(webhook.deliveries.length, 1, 'the held delivery was posted again');
    assert.equal(await webhook.store.countPublications(), 1);
  });
});
