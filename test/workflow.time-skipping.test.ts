/**
 * The workflow on the time-skipping test server: retries under long backoffs, exhausted attempts, invalid inputs
 * and the failure chain a client sees. Activities run for real against local parts (SQLite files, a loopback
 * model server); only the clock is fake, so an hour of backoff takes no wall time.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { ApplicationFailure, RetryState } from '@temporalio/common';
import { WorkflowFailedError } from '@temporalio/client';
import { tsToMs } from '@temporalio/common/lib/time';
import type { temporal } from '@temporalio/proto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { FailureType } from '../src/contract';
import type { PipelineResult } from '../src/cli/compose';
import {
  completion,
  finishedRun,
  installQuietRuntime,
  isTagRequest,
  modelServerFor,
  normalAnswer,
  openAIModel,
  pipelineInput,
  SAMPLE_TEXT,
  stepFailure,
  tempParts,
  timeSkippingEnv,
  withPipeline,
} from './helpers';
import { cleanupAfterAll } from './scratch';

const HOUR_MS = 60 * 60 * 1000;

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();

before(async () => {
  // Failing activities and workflows are what these tests are about; the SDK logs each one as a warning.
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
});

/** Asserts the error chain WorkflowFailedError -> ApplicationFailure (a failure of the workflow itself). */
function workflowFailure(check: (failure: ApplicationFailure) => void): (err: unknown) => boolean {
  return (err) => {
    assert.ok(err instanceof WorkflowFailedError, `expected WorkflowFailedError, got ${String(err)}`);
    assert.ok(
      err.cause instanceof ApplicationFailure,
      `expected ApplicationFailure, got ${String(err.cause)}`,
    );
    check(err.cause);
    return true;
  };
}

/** When an activity was scheduled and completed (server time), and the attempt that completed it. */
function activitySpan(
  history: temporal.api.history.v1.IHistory,
  activityId: string,
): { ms: number; attempt: number } {
  const events = history.events ?? [];
  const scheduled = events.find((e) => e.activityTaskScheduledEventAttributes?.activityId === activityId);
  assert.ok(scheduled?.eventId, `no ${activityId} in the history`);
  const belongs = (id: unknown) => String(id) === String(scheduled.eventId);
  const started = events.find((e) => belongs(e.activityTaskStartedEventAttributes?.scheduledEventId));
  const completed = events.find((e) => belongs(e.activityTaskCompletedEventAttributes?.scheduledEventId));
  assert.ok(started !== undefined && completed !== undefined, `${activityId} did not complete`);
  return {
    ms: tsToMs(completed.eventTime) - tsToMs(scheduled.eventTime),
    attempt: started.activityTaskStartedEventAttributes?.attempt ?? 0,
  };
}

describe('documentPipeline on the time-skipping server', () => {
  it('summarizes, tags and publishes revision 1 under keys <runId>:<step>', async () => {
    const local = await tempParts(defer);
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
    const { result, runId } = await withPipeline(env, local, input, async (handle) => ({
      result: await handle.result(),
      runId: handle.firstExecutionRunId,
    }));

    assert.equal(result.documentId, input.documentId);
    assert.ok(result.summary.summary.length > 0, 'summary is empty');
    assert.ok(result.tags.tags.length > 0, 'no tags');
    assert.deepEqual(result.summary.model, { provider: 'offline', model: 'extractive-wink-nlp' });
    assert.equal(result.tags.model.provider, 'offline');
    assert.equal(result.summary.idempotencyKey, `${runId}:summarize`);
    assert.equal(result.tags.idempotencyKey, `${runId}:tag`);
    assert.deepEqual(result.publication, {
      idempotencyKey: `${runId}:publish`,
      target: 'sqlite',
      documentId: input.documentId,
      revision: 1,
      duplicate: false,
    });
    assert.equal(await local.store.countPublications(), 1);
    assert.deepEqual(await local.store.revisionsOf(input.documentId), [
      { revision: 1, idempotencyKey: `${runId}:publish` },
    ]);
  });

  it('retries a step rejected twice with 429 Retry-After: 3600 within a 4-hour step budget, and skips the hours', async () => {
    let summarizeRequests = 0;
    const server = await modelServerFor(defer, (request) => {
      if (!isTagRequest(request) && ++summarizeRequests <= 2) {
        return { status: 429, headers: { 'retry-after': '3600' }, body: { error: 'rate limited' } };
      }
      return normalAnswer(request);
    });
    const local = await tempParts(defer, { model: openAIModel(server) });
    // Two hours of Retry-After do not fit the default budget of 60 minutes per step.
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT, { options: { stepBudgetMinutes: 240 } });

    const wallStart = Date.now();
    const { result, runId, history } = await withPipeline(env, local, input, finishedRun);
    const wallMs = Date.now() - wallStart;
    // The server's clock as the history recorded it. env.currentTimeMs() is no measure here: the test server
    // also jumps years ahead while the client long-polls for the result of a finished run.
    const summarize = activitySpan(history, 'summarize');

    assert.equal(result.summary.summary, 'Checkpoints let restarts skip finished steps.');
    assert.equal(result.summary.model.provider, 'openai-compatible');
    assert.equal(result.publication?.revision, 1);
    assert.ok(wallMs < 30_000, `took ${wallMs} ms of wall time`);
    assert.equal(summarize.attempt, 3);
    assert.ok(
      summarize.ms >= 2 * HOUR_MS,
      `only ${summarize.ms} ms passed between scheduling and completion`,
    );
    const keys = server.requests.filter((r) => !isTagRequest(r)).map((r) => r.idempotencyKey);
    assert.deepEqual(keys, [`${runId}:summarize`, `${runId}:summarize`, `${runId}:summarize`]);
  });

  it('never fails a step on 429s: twelve in a row (twice MAX_PROVIDER_ERRORS) are each waited out, and five 500s after them still do not end it', async () => {
    // 429s are back-pressure (ProviderBusy), not provider errors: only the 500s count, and five is one short of 6.
    const replies = [...Array<number>(12).fill(429), ...Array<number>(5).fill(500)];
    let summarizeRequests = 0;
    const server = await modelServerFor(defer, (request) => {
      if (isTagRequest(request)) return normalAnswer(request);
      const status = replies[summarizeRequests++];
      if (status === 429) {
        return { status, headers: { 'retry-after': '60' }, body: { error: 'rate limited' } };
      }
      return status === undefined ? normalAnswer(request) : { status, body: { error: 'upstream exploded' } };
    });
    const local = await tempParts(defer, { model: openAIModel(server) });

    const wallStart = Date.now();
    const { result, runId, history } = await withPipeline(
      env,
      local,
      await pipelineInput(local.blobs, SAMPLE_TEXT),
      finishedRun,
    );
    const summarize = activitySpan(history, 'summarize');
    assert.equal(result.summary.summary, 'Checkpoints let restarts skip finished steps.');
    assert.equal(result.publication?.revision, 1);
    assert.equal(summarize.attempt, replies.length + 1);
    // Each 429's Retry-After was waited (on the server's skipped clock), not cut short by the policy's backoff.
    assert.ok(
      summarize.ms >= 12 * 60_000,
      `only ${summarize.ms} ms passed between scheduling and completion`,
    );
    assert.ok(Date.now() - wallStart < 30_000, 'the waits were waited, not skipped');
    const keys = server.requests.filter((r) => !isTagRequest(r)).map((r) => r.idempotencyKey);
    assert.deepEqual(keys, Array<string>(replies.length + 1).fill(`${runId}:summarize`));
  });

  it('fails for good at the 6th provider error of the run (MAX_PROVIDER_ERRORS), quoting the last HTTP 500', async () => {
    // Only summarize fails (tag runs beside it and succeeds), so the failing step is known.
    const server = await modelServerFor(defer, (request) =>
      isTagRequest(request) ? normalAnswer(request) : { status: 500, body: { error: 'upstream exploded' } },
    );
    const local = await tempParts(defer, { model: openAIModel(server) });
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT);

    const wallStart = Date.now();
    await withPipeline(env, local, input, (handle) =>
      assert.rejects(
        handle.result(),
        stepFailure('summarize', (failure, activity) => {
          assert.equal(failure.type, FailureType.ProviderErrorsExhausted);
          assert.match(failure.message, /summarize failed after 6 attempts \(provider errors in this run/);
          assert.match(failure.message, /HTTP 500/);
          assert.match(failure.message, /upstream exploded/);
          assert.equal(activity.retryState, RetryState.NON_RETRYABLE_FAILURE);
        }),
      ),
    );
    assert.ok(Date.now() - wallStart < 30_000, 'the backoffs were waited, not skipped');
    assert.equal(server.requests.filter((r) => !isTagRequest(r)).length, 6);
    assert.equal(await local.store.countPublications(), 0);
  });

  describe('refuses an invalid input at once, before any step runs', () => {
    const cases: Array<{
      name: string;
      input: (valid: Record<string, unknown>) => unknown;
      type: string;
      message: RegExp;
    }> = [
      {
        name: 'maxTags out of range names options.maxTags',
        input: (valid) => ({ ...valid, options: { maxTags: 99 } }),
        type: FailureType.InvalidInput,
        message: /options\.maxTags/,
      },
      {
        name: 'an unknown option names the field',
        input: (valid) => ({ ...valid, options: { maxTagz: 3 } }),
        type: FailureType.InvalidInput,
        message: /options: unknown field\(s\) "maxTagz"/,
      },
      {
        name: 'a missing documentId names documentId',
        input: ({ documentId: _documentId, ...rest }) => rest,
        type: FailureType.InvalidInput,
        message: /documentId/,
      },
      {
        name: 'schemaVersion 0 is an unsupported schema version',
        input: (valid) => ({ ...valid, schemaVersion: 0 }),
        type: FailureType.UnsupportedSchemaVersion,
        message: /schemaVersion 0/,
      },
    ];
    for (const { name, input, type, message } of cases) {
      it(name, async () => {
        const server = await modelServerFor(defer, normalAnswer);
        const local = await tempParts(defer, { model: openAIModel(server) });
        const valid = { ...(await pipelineInput(local.blobs, SAMPLE_TEXT)) };

        const status = await withPipeline(env, local, input(valid), async (handle) => {
          await assert.rejects(
            handle.result(),
            workflowFailure((failure) => {
              assert.equal(failure.type, type);
              assert.equal(failure.nonRetryable, true);
              assert.match(failure.message, message);
            }),
          );
          return (await handle.describe()).status.name;
        });
        assert.equal(status, 'FAILED');
        assert.equal(server.requests.length, 0, 'a model step ran');
        assert.equal(await local.memo.count(), 0);
        assert.equal(await local.store.countPublications(), 0, 'the publish step ran');
      });
    }
  });

  describe('a tags answer that is not {"tags": [...]}', () => {
    const malformed = [
      { name: 'not JSON', content: 'Sure! Here are some tags: checkpoints, idempotency' },
      { name: 'JSON of another shape', content: '{"labels": ["checkpoints"]}' },
    ];
    for (const { name, content } of malformed) {
      it(`fails at the 6th refused answer when it stays ${name}, quoting it`, async () => {
        const server = await modelServerFor(defer, (request) =>
          isTagRequest(request) ? { body: completion(content) } : normalAnswer(request),
        );
        const local = await tempParts(defer, { model: openAIModel(server) });

        await withPipeline(env, local, await pipelineInput(local.blobs, SAMPLE_TEXT), (handle) =>
          assert.rejects(
            handle.result(),
            stepFailure('tag', (failure, activity) => {
              assert.equal(failure.type, FailureType.ProviderErrorsExhausted);
              assert.equal(failure.nonRetryable, true);
              assert.match(failure.message, /did not answer with \{"tags": \[\.\.\.\]\}/);
              assert.ok(failure.message.includes(content.slice(0, 20)), failure.message);
              assert.equal(activity.retryState, RetryState.NON_RETRYABLE_FAILURE);
            }),
          ),
        );
        assert.equal(server.requests.filter(isTagRequest).length, 6);
        assert.equal(await local.store.countPublications(), 0);
      });
    }

    it('is retried and the run succeeds when the next answer is valid', async () => {
      let tagRequests = 0;
      const server = await modelServerFor(defer, (request) =>
        isTagRequest(request) && ++tagRequests === 1
          ? { body: completion('{"labels": ["checkpoints"]}') }
          : normalAnswer(request),
      );
      const local = await tempParts(defer, { model: openAIModel(server) });

      const result: PipelineResult = await withPipeline(
        env,
        local,
        await pipelineInput(local.blobs, SAMPLE_TEXT),
        (handle) => handle.result(),
      );
      assert.deepEqual(result.tags.tags, ['checkpoints', 'idempotency']);
      assert.equal(server.requests.filter(isTagRequest).length, 2);
      assert.equal(await local.store.countPublications(), 1);
    });
  });

  it('fails without retry on HTTP 401 and says to check OPENAI_API_KEY', async () => {
    const server = await modelServerFor(defer, (request) =>
      isTagRequest(request) ? normalAnswer(request) : { status: 401, body: { error: 'invalid api key' } },
    );
    const local = await tempParts(defer, { model: openAIModel(server) });

    await withPipeline(env, local, await pipelineInput(local.blobs, SAMPLE_TEXT), (handle) =>
      assert.rejects(
        handle.result(),
        stepFailure('summarize', (failure, activity) => {
          assert.equal(failure.type, FailureType.ModelRejected);
          assert.equal(failure.nonRetryable, true);
          assert.match(failure.message, /HTTP 401/);
          assert.match(failure.message, /check OPENAI_API_KEY/);
          assert.equal(activity.retryState, RetryState.NON_RETRYABLE_FAILURE);
        }),
      ),
    );
    assert.equal(server.requests.filter((r) => !isTagRequest(r)).length, 1);
  });
});
