/**
 * Model faults against a real OpenAI-compatible HTTP server on loopback: each way a provider fails, through the
 * summarize and tag activities (MockActivityEnvironment) and, for a few, through real runs on the time-skipping
 * server. Retryable faults must be retryable (with Retry-After honoured), the rest must fail at once and say why.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { ApplicationFailure, CancelledFailure, RetryState } from '@temporalio/common';
import { msToNumber } from '@temporalio/common/lib/time';
import type { temporal } from '@temporalio/proto';
import { MockActivityEnvironment } from '@temporalio/testing';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger } from '@temporalio/worker';
import { z } from 'zod';
import { Registry } from 'prom-client';
import { pipelineActivities } from '../src/cli/compose';
import type { DocumentModel } from '../src/model/types';
import { BusyDetailsSchema } from '../src/model/pacer';
import { pipelineMetrics } from '../src/telemetry/metrics';
import type { PipelineMetrics } from '../src/telemetry/metrics';
import { FailureType } from '../src/contract';
import type { SummarizeResult } from './requests';
import type { TagResult } from './requests';
import {
  applicationFailure,
  closeServer,
  completion,
  finishedRun,
  installQuietRuntime,
  isTagRequest,
  listenOnLoopback,
  modelServerFor,
  normalAnswer,
  openAIModel,
  pipelineInput,
  SAMPLE_TEXT,
  stepFailure,
  SUMMARY,
  TAGS,
  tempParts,
  timeSkippingEnv,
  until,
  withPipeline,
} from './helpers';
import { cleanupAfterAll } from './scratch';
import type { ChatReply, LocalParts, StartedPipeline } from './helpers';

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();
const quietLogger = new DefaultLogger('ERROR');

before(async () => {
  installQuietRuntime(quietLogger);
  env = await timeSkippingEnv(defer);
});

interface SeenRequest {
  idempotencyKey: string | undefined;
  /** The request says it is the tag step's (`x-pipeline-step`). */
  tag: boolean;
  /** The connection closed before this server finished its answer: the client gave up, or the server reset it. */
  abandoned: boolean;
}

interface RawExchange {
  n: number;
  tag: boolean;
  req: http.IncomingMessage;
  res: http.ServerResponse;
  answer(body: unknown, status?: number): void;
}

/**
 * A model server at the socket level, for what startModelServer cannot do: reset a connection, cut a body short,
 * answer late, and notice when the client hangs up.
 */
async function rawModelServer(
  handle: (exchange: RawExchange) => void,
): Promise<{ baseUrl: string; seen: SeenRequest[] }> {
  const seen: SeenRequest[] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const header = req.headers['idempotency-key'];
      const entry: SeenRequest = {
        idempotencyKey: typeof header === 'string' ? header : undefined,
        tag: req.headers['x-pipeline-step'] === 'tag',
        abandoned: false,
      };
      seen.push(entry);
      res.on('close', () => {
        if (!res.writableFinished) entry.abandoned = true;
      });
      handle({
        n: seen.length,
        tag: entry.tag,
        req,
        res,
        answer: (body, status = 200) => {
          if (res.destroyed) return;
          res.writeHead(status, { 'content-type': 'application/json' });
          res.end(typeof body === 'string' ? body : JSON.stringify(body));
        },
      });
    });
  });
  const origin = await listenOnLoopback(server);
  defer(() => closeServer(server));
  return { baseUrl: `${origin}/v1`, seen };
}

type Step = 'summarize' | 'tag';

/** One attempt of one model step of a fresh run, in MockActivityEnvironment, against `model`. */
async function stepAttempt(step: Step, model: DocumentModel, metrics?: PipelineMetrics) {
  const local = await tempParts(defer, { model });
  const runId = randomUUID();
  const mock = new MockActivityEnvironment(
    { activityId: step, workflowExecution: { workflowId: `wf-${randomUUID()}`, runId } },
    { logger: quietLogger },
  );
  const activities = pipelineActivities(metrics === undefined ? local.deps : { ...local.deps, metrics });
  const base = { documentId: 'doc-1', textRef: await local.blobs.put(Buffer.from(SAMPLE_TEXT, 'utf8')) };
  const run = (): Promise<SummarizeResult | TagResult> =>
    step === 'summarize'
      ? mock.run(activities.summarize, { ...base, maxSentences: 2 })
      : mock.run(activities.tag, { ...base, maxTags: 3 });
  return { local, mock, key: `${runId}:${step}`, run };
}

describe('model faults through the activities', () => {
  const statusCases: Array<{
    name: string;
    reply: ChatReply;
    step: Step;
    expect: (err: unknown) => boolean;
  }> = [
    {
      name: '429 with Retry-After in seconds is back-pressure (ProviderBusy), and the next retry waits exactly that long',
      reply: { status: 429, headers: { 'retry-after': '7' }, body: { error: 'rate limited' } },
      step: 'summarize',
      expect: applicationFailure(
        FailureType.ProviderBusy,
        true,
        [/HTTP 429 \(rate limited\)/, /Retry-After 7 s/, /rate limited/],
        (f) => {
          assert.ok(f.nextRetryDelay !== undefined && f.nextRetryDelay !== null, 'no nextRetryDelay');
          assert.equal(msToNumber(f.nextRetryDelay), 7_000);
          const details = BusyDetailsSchema.parse(f.details?.[0]);
          assert.equal(details.overloaded, false);
          assert.equal(details.retryAfterMs, 7_000);
        },
      ),
    },
    {
      name: '503 (overloaded) is back-pressure (ProviderBusy) with the policy backoff, quoting the body',
      reply: { status: 503, body: { error: 'overloaded, try later' } },
      step: 'tag',
      expect: applicationFailure(
        FailureType.ProviderBusy,
        true,
        [/HTTP 503 \(overloaded\)/, /overloaded, try later/],
        (f) => {
          assert.equal(f.nextRetryDelay, undefined);
          assert.equal(BusyDetailsSchema.parse(f.details?.[0]).overloaded, true);
        },
      ),
    },
    {
      name: "429 for the account's quota (insufficient_quota) is non-retryable ModelRejected: waiting does not help",
      reply: {
        status: 429,
        body: {
          error: {
            message: 'You exceeded your current quota, please check your plan and billing details.',
            type: 'insufficient_quota',
            param: null,
            code: 'insufficient_quota',
          },
        },
      },
      step: 'summarize',
      expect: applicationFailure(FailureType.ModelRejected, false, [
        /HTTP 429 for the account's quota/,
        /insufficient_quota/,
        /add credits or raise the account's quota/,
      ]),
    },
    {
      name: '500 is retryable with the policy backoff, quoting the body',
      reply: { status: 500, body: { error: 'upstream exploded' } },
      step: 'tag',
      expect: applicationFailure(
        FailureType.TransientModelError,
        true,
        [/HTTP 500/, /upstream exploded/],
        (f) => {
          assert.equal(f.nextRetryDelay, undefined);
        },
      ),
    },
    {
      name: 'a JSON body cut short is retryable ModelOutputInvalid',
      reply: { body: '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "Checkp' },
      step: 'summarize',
      expect: applicationFailure(FailureType.ModelOutputInvalid, true, [
        /client could not read/,
        /"content": "Checkp/,
      ]),
    },
    {
      name: 'a body that is not JSON at all is retryable ModelOutputInvalid quoting it',
      reply: { body: '<html><body>502 Bad Gateway (nginx)</body></html>' },
      step: 'tag',
      expect: applicationFailure(FailureType.ModelOutputInvalid, true, [
        /client could not read/,
        /502 Bad Gateway \(nginx\)/,
      ]),
    },
    {
      name: 'a refusal (message.refusal) is non-retryable ModelRejected quoting it',
      reply: {
        body: {
          choices: [
            {
              index: 0,
              message: { role: 'assistant', content: null, refusal: 'I cannot help with this document.' },
              finish_reason: 'stop',
            },
          ],
        },
      },
      step: 'summarize',
      expect: applicationFailure(FailureType.ModelRejected, false, [
        /refused the document/,
        /I cannot help with this document\./,
      ]),
    },
    {
      name: "finish_reason 'content_filter' is non-retryable ModelRejected",
      reply: {
        body: {
          choices: [
            { index: 0, message: { role: 'assistant', content: '' }, finish_reason: 'content_filter' },
          ],
        },
      },
      step: 'tag',
      expect: applicationFailure(FailureType.ModelRejected, false, [
        /refused the document/,
        /content filter/,
      ]),
    },
    {
      name: "finish_reason 'length' (cut off) is retryable ModelOutputInvalid",
      reply: {
        body: {
          choices: [
            { index: 0, message: { role: 'assistant', content: 'Checkpoints let' }, finish_reason: 'length' },
          ],
        },
      },
      step: 'summarize',
      expect: applicationFailure(FailureType.ModelOutputInvalid, true, [/cut off/, /finish reason "length"/]),
    },
  ];
  for (const { name, reply, step, expect } of statusCases) {
    it(name, async () => {
      const server = await modelServerFor(defer, () => reply);
      const attempt = await stepAttempt(step, openAIModel(server));
      await assert.rejects(attempt.run(), expect);
      assert.deepEqual(
        server.requests.map((r) => r.idempotencyKey),
        [attempt.key],
      );
      assert.equal(await attempt.local.memo.count(), 0, 'a failed answer was memoised');
    });
  }

  it('counts the tokens of an answer it paid for and refused, though the attempt fails', async () => {
    const server = await modelServerFor(defer, () => ({
      body: {
        choices: [
          { index: 0, message: { role: 'assistant', content: 'Checkpoints let' }, finish_reason: 'length' },
        ],
        usage: { prompt_tokens: 120, completion_tokens: 30, total_tokens: 150 },
      },
    }));
    const registry = new Registry();
    const attempt = await stepAttempt('summarize', openAIModel(server), pipelineMetrics(registry));
    await assert.rejects(
      attempt.run(),
      applicationFailure(FailureType.ModelOutputInvalid, true, [/cut off/]),
    );
    const page = await registry.metrics();
    assert.match(page, /pipeline_model_tokens_total\{step="summarize",[^}]*type="input"\} 120\n/, page);
    assert.match(page, /pipeline_model_tokens_total\{step="summarize",[^}]*type="output"\} 30\n/, page);
    assert.doesNotMatch(page, /pipeline_memo_hits_total\{[^}]*\} [1-9]/, page);
  });

  it('429 with Retry-After as an HTTP date waits until that date', async () => {
    const server = await modelServerFor(defer, () => ({
      status: 429,
      headers: { 'retry-after': new Date(Date.now() + 30_000).toUTCString() },
      body: { error: 'slow down' },
    }));
    const attempt = await stepAttempt('summarize', openAIModel(server));
    await assert.rejects(
      attempt.run(),
      applicationFailure(FailureType.ProviderBusy, true, [/HTTP 429/], (f) => {
        assert.ok(f.nextRetryDelay !== undefined && f.nextRetryDelay !== null, 'no nextRetryDelay');
        const ms = msToNumber(f.nextRetryDelay);
        assert.ok(ms > 27_000 && ms <= 30_000, `nextRetryDelay ${ms} ms`);
      }),
    );
  });

  for (const status of [429, 503]) {
    it(`${status} is never counted as a provider error: at MAX_PROVIDER_ERRORS=1 it stays retryable, where a 500 ends the step`, async () => {
      const statuses = [status, status, status, 500];
      let answered = 0;
      const server = await modelServerFor(defer, () => ({
        status: statuses[answered++] ?? 500,
        headers: { 'retry-after': '1' },
        body: { error: 'busy' },
      }));
      const local = await tempParts(defer, {
        model: openAIModel(server),
        env: { MAX_PROVIDER_ERRORS: '1' },
      });
      const runId = randomUUID();
      const activities = pipelineActivities(local.deps);
      const textRef = await local.blobs.put(Buffer.from(SAMPLE_TEXT, 'utf8'));
      // Attempts of one step of one run, as the server retries it: the memo counts its provider errors across them.
      const attempt = (n: number) =>
        new MockActivityEnvironment(
          {
            activityId: 'summarize',
            attempt: n,
            workflowExecution: { workflowId: `wf-${runId}`, runId },
          },
          { logger: quietLogger },
        ).run(activities.summarize, { documentId: 'doc-1', textRef, maxSentences: 2 });
      for (const n of [1, 2, 3]) {
        await assert.rejects(
          attempt(n),
          applicationFailure(FailureType.ProviderBusy, true, [new RegExp(`HTTP ${status}`)]),
        );
      }
      await assert.rejects(
        attempt(4),
        applicationFailure(FailureType.ProviderErrorsExhausted, false, [
          /summarize failed after 1 attempts \(provider errors in this run; MAX_PROVIDER_ERRORS is 1\)/,
          /HTTP 500/,
        ]),
      );
      assert.equal(server.requests.length, 4);
      assert.equal(await local.memo.count(), 0);
    });
  }

  it('names the model server by its origin only: a path in OPENAI_BASE_URL never reaches a message', async () => {
    const server = await modelServerFor(defer, () => ({ status: 503, body: { error: 'busy' } }));
    const origin = new URL(server.baseUrl).origin;
    const withTenant = { baseUrl: `${origin}/tenant-4f9c2a-secret/v1` };
    const attempt = await stepAttempt('summarize', openAIModel(withTenant));
    await assert.rejects(attempt.run(), (err) => {
      assert.ok(err instanceof ApplicationFailure, String(err));
      assert.ok(err.message.includes(`model server at ${origin}`), err.message);
      assert.doesNotMatch(err.message, /tenant-4f9c2a-secret|chat\/completions/);
      return true;
    });
    assert.equal(
      server.requests[0]?.route,
      'tenant-4f9c2a-secret',
      'the request did not go through the path',
    );
  });

  const tagCases = [
    { name: 'an empty list', content: '{"tags": []}', path: /\(tags: /, excerpt: '{"tags": []}' },
    {
      name: 'an empty tag',
      content: '{"tags": ["checkpoints", ""]}',
      path: /\(tags\.1: /,
      excerpt: '"checkpoints", ""',
    },
    { name: 'a number for a tag', content: '{"tags": [42]}', path: /\(tags\.0: /, excerpt: '[42]' },
    {
      name: 'a 61-character tag',
      content: `{"tags": ["${'x'.repeat(61)}"]}`,
      path: /\(tags\.0: /,
      excerpt: 'xxxxxxxxxx',
    },
    {
      name: 'one string for the list',
      content: '{"tags": "checkpoints, idempotency"}',
      path: /\(tags: /,
      excerpt: 'checkpoints, idempotency',
    },
  ];
  for (const { name, content, path, excerpt } of tagCases) {
    it(`tags that fail the schema (${name}) are retryable ModelOutputInvalid naming the field`, async () => {
      const server = await modelServerFor(defer, () => ({ body: completion(content) }));
      const attempt = await stepAttempt('tag', openAIModel(server));
      await assert.rejects(
        attempt.run(),
        applicationFailure(
          FailureType.ModelOutputInvalid,
          true,
          [/did not answer with \{"tags": \[\.\.\.\]\}/, path],
          (f) => assert.ok(f.message.includes(excerpt), f.message),
        ),
      );
      assert.equal(await attempt.local.memo.count(), 0);
    });
  }

  it('a request with no answer is retryable and says no answer came within the timeout; the request is dropped', async () => {
    const server = await rawModelServer(() => {});
    const attempt = await stepAttempt('summarize', openAIModel(server, { requestTimeoutMs: 300 }));
    const started = Date.now();
    await assert.rejects(
      attempt.run(),
      applicationFailure(FailureType.TransientModelError, true, [/no answer within 300 ms/]),
    );
    const ms = Date.now() - started;
    assert.ok(ms >= 290 && ms < 3_000, `gave up after ${ms} ms`);
    await until(() => server.seen[0]?.abandoned === true, 'the client to hang up');
    assert.deepEqual(
      server.seen.map((s) => s.idempotencyKey),
      [attempt.key],
    );
  });

  it('a connection reset is retryable and says the request failed', async () => {
    const server = await rawModelServer(({ req }) => req.socket.destroy());
    const attempt = await stepAttempt('tag', openAIModel(server));
    await assert.rejects(
      attempt.run(),
      applicationFailure(FailureType.TransientModelError, true, [
        /request failed/,
        new RegExp(`model server at ${new URL(server.baseUrl).origin}:`),
      ]),
    );
    assert.equal(server.seen.length, 1, 'the POST was repeated by the HTTP client');
    assert.equal(await attempt.local.memo.count(), 0);
  });

  it('a body cut off mid-transfer (connection closed before Content-Length bytes) is retryable', async () => {
    const server = await rawModelServer(({ res }) => {
      const body = JSON.stringify(completion(SUMMARY));
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(body.length) });
      res.write(body.slice(0, 40));
      setTimeout(() => res.destroy(), 50);
    });
    const attempt = await stepAttempt('summarize', openAIModel(server));
    await assert.rejects(
      attempt.run(),
      applicationFailure(FailureType.TransientModelError, true, [/request failed/]),
    );
  });

  it('heartbeats while a slow model takes 5 s to answer, then returns the answer', async () => {
    const server = await rawModelServer(({ answer }) => {
      setTimeout(() => answer(completion(SUMMARY)), 5_000);
    });
    const attempt = await stepAttempt('summarize', openAIModel(server, { requestTimeoutMs: 30_000 }));
    let duringCall = 0;
    attempt.mock.on('heartbeat', () => {
      if (server.seen.length > 0) duringCall++;
    });
    const result = await attempt.run();
    assert.ok(duringCall >= 2, `${duringCall} heartbeat(s) while the model was thinking`);
    assert.ok('summary' in result, 'not a summarize result');
    assert.equal(result.summary, SUMMARY);
    assert.equal(result.idempotencyKey, attempt.key);
    assert.equal(result.memoised, false);
    assert.deepEqual(result.usage, { inputTokens: 100, outputTokens: 20 });
    assert.deepEqual(result.model, { provider: 'openai-compatible', model: 'test-model' });
  });

  it('cancelling the activity aborts the HTTP request at once', async () => {
    const server = await rawModelServer(() => {});
    const attempt = await stepAttempt('tag', openAIModel(server, { requestTimeoutMs: 5_000 }));
    const running = attempt.run();
    await until(() => server.seen.length === 1, 'the request to arrive');
    const cancelledAt = Date.now();
    attempt.mock.cancel();
    await assert.rejects(running, (err) => {
      assert.ok(err instanceof CancelledFailure, `expected CancelledFailure, got ${String(err)}`);
      return true;
    });
    await until(() => server.seen[0]?.abandoned === true, 'the connection to close', 2_000);
    assert.ok(Date.now() - cancelledAt < 2_000, 'the request outlived the cancellation');
    assert.equal(await attempt.local.memo.count(), 0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// A few of the same faults through real runs: what the retry policy makes of them.
// ---------------------------------------------------------------------------------------------------------------

/** Starts the pipeline on the sample text on a fresh task queue with a worker on `local` until `use` is done. */
async function withSamplePipeline<T>(
  local: LocalParts,
  use: (handle: StartedPipeline) => Promise<T>,
): Promise<T> {
  return withPipeline(env, local, await pipelineInput(local.blobs, SAMPLE_TEXT), use, {
    taskQueuePrefix: 'model-faults-',
  });
}

/** The attempt number of the recorded (final) start of a step. */
function finalAttempt(history: temporal.api.history.v1.IHistory, activityId: string): number | undefined {
  const events = history.events ?? [];
  const scheduled = events.find((e) => e.activityTaskScheduledEventAttributes?.activityId === activityId);
  const started = events.find(
    (e) => String(e.activityTaskStartedEventAttributes?.scheduledEventId) === String(scheduled?.eventId),
  );
  return started?.activityTaskStartedEventAttributes?.attempt ?? undefined;
}

describe('model faults through real runs on the time-skipping server', () => {
  it('a connection reset on the first summarize attempt is retried under the same key and the run completes', async () => {
    let resets = 0;
    const server = await rawModelServer(({ tag, req, answer }) => {
      if (!tag && resets++ === 0) req.socket.destroy();
      else answer(completion(tag ? TAGS : SUMMARY));
    });
    const local = await tempParts(defer, { model: openAIModel(server) });
    const { result, runId, history } = await withSamplePipeline(local, finishedRun);
    assert.equal(result.summary.summary, SUMMARY);
    assert.equal(result.publication?.revision, 1);
    assert.equal(finalAttempt(history, 'summarize'), 2);
    const keys = server.seen.filter((s) => !s.tag).map((s) => s.idempotencyKey);
    assert.deepEqual(keys, [`${runId}:summarize`, `${runId}:summarize`]);
  });

  it('a request timeout on the first tag attempt is retried under the same key and the run completes', async () => {
    let hung = 0;
    const server = await rawModelServer(({ tag, answer }) => {
      if (tag && hung++ === 0) return;
      answer(completion(tag ? TAGS : SUMMARY));
    });
    const local = await tempParts(defer, { model: openAIModel(server, { requestTimeoutMs: 500 }) });
    const { result, runId, history } = await withSamplePipeline(local, finishedRun);
    assert.deepEqual(result.tags.tags, ['checkpoints', 'idempotency']);
    assert.equal(finalAttempt(history, 'tag'), 2);
    const tagRequests = server.seen.filter((s) => s.tag);
    assert.deepEqual(
      tagRequests.map((s) => s.idempotencyKey),
      [`${runId}:tag`, `${runId}:tag`],
    );
    assert.equal(tagRequests[0]?.abandoned, true, 'the timed-out request was left open');
  });

  it('a refusal of the summary fails the run at once: one request, no retry, nothing published', async () => {
    const server = await modelServerFor(defer, (request) =>
      isTagRequest(request)
        ? normalAnswer(request)
        : {
            body: {
              choices: [
                {
                  index: 0,
                  message: { role: 'assistant', content: null, refusal: 'Policy says no.' },
                  finish_reason: 'stop',
                },
              ],
            },
          },
    );
    const local = await tempParts(defer, { model: openAIModel(server) });
    await withSamplePipeline(local, (handle) =>
      assert.rejects(
        handle.result(),
        stepFailure('summarize', (failure, activity) => {
          assert.equal(failure.type, FailureType.ModelRejected);
          assert.equal(failure.nonRetryable, true);
          assert.match(failure.message, /refused the document: Policy says no\./);
          assert.equal(activity.retryState, RetryState.NON_RETRYABLE_FAILURE);
        }),
      ),
    );
    assert.equal(
      server.requests.filter((r) => !isTagRequest(r)).length,
      1,
      'the refused summary was retried',
    );
    assert.equal(await local.store.countPublications(), 0);
  });

  it('tags that keep failing the schema: each retry quotes the error and caps the tokens, and the 6th refusal fails the step for good', async () => {
    const server = await modelServerFor(defer, (request) =>
      isTagRequest(request) ? { body: completion('{"tags": []}') } : normalAnswer(request),
    );
    const local = await tempParts(defer, { model: openAIModel(server) });
    const runId = await withSamplePipeline(local, async (handle) => {
      await assert.rejects(
        handle.result(),
        stepFailure('tag', (failure, activity) => {
          assert.equal(failure.type, FailureType.ProviderErrorsExhausted);
          assert.equal(failure.nonRetryable, true);
          assert.match(
            failure.message,
            /tag failed after 6 attempts \(provider errors in this run; MAX_PROVIDER_ERRORS is 6\):/,
          );
          assert.match(
            failure.message,
            /model test-model did not answer with \{"tags": \[\.\.\.\]\} \(tags: /,
          );
          assert.match(failure.message, /its answer began: \{"tags": \[\]\}/);
          assert.equal(activity.retryState, RetryState.NON_RETRYABLE_FAILURE);
        }),
      );
      return handle.firstExecutionRunId;
    });
    const tagRequests = server.requests.filter(isTagRequest);
    assert.deepEqual(
      tagRequests.map((r) => r.idempotencyKey),
      Array(6).fill(`${runId}:tag`),
    );
    // Every request asks for the tags' JSON schema and caps the tokens; every retry also quotes the refusal, in the
    // user's message after the document.
    const TagBodySchema = z.object({
      max_tokens: z.number().int().positive(),
      response_format: z.object({ type: z.literal('json_schema') }),
      messages: z.array(z.object({ role: z.string(), content: z.string() })),
    });
    const userText = (body: z.infer<typeof TagBodySchema>): string =>
      body.messages.find((m) => m.role === 'user')?.content ?? '';
    const [first, ...retries] = tagRequests.map((r) => TagBodySchema.parse(r.body));
    assert.ok(first !== undefined);
    assert.doesNotMatch(userText(first), /refused/);
    for (const retry of retries) {
      assert.equal(retry.max_tokens, first.max_tokens, 'a retry asked for another cap');
      assert.match(
        userText(retry),
        /<\/document>\n\n.*Your previous answer to this request was refused: model/s,
      );
    }
    assert.equal(await local.store.countPublications(), 0);
  });
});
