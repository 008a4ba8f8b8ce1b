/**
 * The model steps' claim-first memo, outside a worker (MockActivityEnvironment), against both backends: a second
 * attempt waits for the first one's call instead of paying again, takes over only once the first stopped renewing
 * its lease, provider errors are counted per run and bounded, and a paid answer that was refused is kept with its
 * tokens and quoted back on the retry.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { ActivityCancellationDetails, ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import { DefaultLogger } from '@temporalio/worker';
import { z } from 'zod';
import { pipelineActivities } from '../src/cli/compose';
import type { AnswerMemo } from '../src/model/memo';
import { estimateCost } from '../src/model/pricing';
import { FailureType } from '../src/contract';
import type { SummarizeResult } from './requests';
import { completion, modelServerFor, openAIModel, SAMPLE_TEXT, SUMMARY, tempParts } from './helpers';
import { cleanupAfterAll } from './scratch';
import type { ChatScript, LocalParts, ModelServer } from './helpers';
import { freshDatabase } from './postgres';

const defer = cleanupAfterAll();
const quietLogger = new DefaultLogger('ERROR');

const BACKENDS = {
  sqlite: (): Promise<Record<string, string>> => Promise.resolve({}),
  postgres: async (): Promise<Record<string, string>> => ({ DATABASE_URL: await freshDatabase(defer) }),
};

/** One document's summarize step, as any number of attempts of one run (or of later runs) would run it. */
async function summarizeStep(
  backend: keyof typeof BACKENDS,
  script: ChatScript,
  {
    requestTimeoutMs,
    startToCloseTimeoutMs = 120_000,
    ...settings
  }: {
    memoLeaseMs?: number;
    maxProviderErrors?: number;
    /** The model client's own timeout of one request (the tests' default otherwise). */
    requestTimeoutMs?: number;
    /** The attempts' start-to-close timeout: the default modelTimeoutSeconds unless told. */
    startToCloseTimeoutMs?: number;
  } = {},
): Promise<{
  server: ModelServer;
  local: LocalParts;
  attempt: (n: number, runId?: string) => { env: MockActivityEnvironment; result: Promise<SummarizeResult> };
  runId: string;
}> {
  const server = await modelServerFor(defer, script);
  const model = openAIModel(server, requestTimeoutMs === undefined ? {} : { requestTimeoutMs });
  const local = await tempParts(defer, { model, env: await BACKENDS[backend]() });
  Object.assign(local.deps, settings, {
    prices: { 'test-model': { inputPerMillion: 1, outputPerMillion: 4 } },
  });
  const textRef = await local.blobs.put(Buffer.from(SAMPLE_TEXT));
  const workflowId = `document-${randomUUID()}`;
  const firstRun = randomUUID();
  return {
    server,
    local,
    runId: firstRun,
    attempt(n, runId = firstRun) {
      const env = new MockActivityEnvironment(
        {
          activityId: 'summarize',
          workflowExecution: { workflowId, runId },
          attempt: n,
          startToCloseTimeoutMs,
        },
        { logger: quietLogger },
      );
      const { summarize } = pipelineActivities(local.deps);
      return { env, result: env.run(summarize, { documentId: 'doc-1', textRef, maxSentences: 2 }) };
    },
  };
}

/** A memo that never renews its claims, standing in for a worker that froze (SIGSTOP) in the middle of a call. */
function frozen(memo: AnswerMemo): AnswerMemo {
  return Object.assign(Object.create(memo) as AnswerMemo, { renew: () => Promise.resolve(true) });
}

const ChatBodySchema = z.object({
  max_tokens: z.number().int().positive().optional(),
  messages: z.array(z.object({ role: z.string(), content: z.string() })),
});

for (const backend of Object.keys(BACKENDS) as (keyof typeof BACKENDS)[]) {
  describe(`claim-first memo (${backend})`, () => {
    it('an attempt that finds a live claim waits for its answer: one model call, renewed past the lease', async () => {
      // The first call takes 2.5 s, over twice the 1 s lease: only renewal keeps the claim alive that long.
      const step = await summarizeStep(backend, () => ({ body: completion(SUMMARY), delayMs: 2_500 }), {
        memoLeaseMs: 1_000,
      });
      const first = step.attempt(1);
      await new Promise((resolve) => setTimeout(resolve, 200));
      const second = step.attempt(2);

      const [a, b] = await Promise.all([first.result, second.result]);
      assert.equal(step.server.requests.length, 1, 'the waiting attempt paid again');
      assert.equal(a.summary, SUMMARY);
      assert.equal(b.summary, SUMMARY);
      assert.deepEqual([a.memoised, b.memoised], [false, true]);
      assert.equal(b.idempotencyKey, `${step.runId}:summarize`);
    });

    it('an attempt the server gave up on still stores the answer it paid for, however late: the successor waiting on it pays nothing', async () => {
      // A stall past the heartbeat timeout, or a server that was down: the attempt learns it was given up on (not
      // found) while its call is still out. The answer comes 2.5 s later, paid for all the same. The attempt's claim
      // is still live and the successor waits on it, so the call must not be cut off, and its answer must reach the
      // memo.
      const step = await summarizeStep(backend, () => ({ body: completion(SUMMARY), delayMs: 3_000 }));
      const abandoned = step.attempt(1);
      await new Promise((resolve) => setTimeout(resolve, 200));
      const successor = step.attempt(2);
      await new Promise((resolve) => setTimeout(resolve, 300));
      abandoned.env.cancel('NOT_FOUND', new ActivityCancellationDetails({ notFound: true }));

      const result = await successor.result;
      await abandoned.result.catch(() => undefined);
      assert.equal(step.server.requests.length, 1, 'the successor paid again');
      assert.equal(result.summary, SUMMARY);
      assert.equal(result.memoised, true);
    });

    it(
      "stops a call still going at its attempt's start-to-close deadline, and the successor calls again",
      { timeout: 30_000 },
      async () => {
        // The first call hangs. The server gives up on its attempt (timed out) before the 1.5 s start-to-close
        // deadline; at the deadline the call is hung by the step's own measure and is stopped, releasing the claim.
        // Without that stop, the successor would wait out the client's 60 s request timeout, past this test's 30 s.
        let calls = 0;
        const step = await summarizeStep(
          backend,
          () => (++calls === 1 ? 'hang' : { body: completion(SUMMARY) }),
          { requestTimeoutMs: 60_000, startToCloseTimeoutMs: 1_500 },
        );
        const abandoned = step.attempt(1);
        // It fails once its call is stopped, long before the successor is done.
        const abandonedEnded = abandoned.result.catch(() => undefined);
        await new Promise((resolve) => setTimeout(resolve, 200));
        const successor = step.attempt(2);
        await new Promise((resolve) => setTimeout(resolve, 300));
        abandoned.env.cancel('TIMED_OUT', new ActivityCancellationDetails({ timedOut: true }));

        const result = await successor.result;
        await abandonedEnded;
        assert.equal(step.server.requests.length, 2);
        assert.equal(result.summary, SUMMARY);
        assert.equal(result.memoised, false);
      },
    );

    it('a claim whose owner stopped renewing is taken over once its lease runs out, and no sooner', async () => {
      const step = await summarizeStep(
        backend,
        (_request, n) => (n === 1 ? 'hang' : { body: completion(SUMMARY) }),
        { memoLeaseMs: 1_500 },
      );
      const live = step.local.deps.memo;
      step.local.deps.memo = frozen(live);
      const stalled = step.attempt(1);
      await new Promise((resolve) => setTimeout(resolve, 200));
      step.local.deps.memo = live;
      const startedAt = Date.now();
      const successor = step.attempt(2);

      const result = await successor.result;
      const waited = Date.now() - startedAt;
      assert.ok(waited >= 1_000, `took over after ${waited} ms, inside the stalled owner's lease`);
      assert.equal(result.memoised, false);
      assert.equal(step.server.requests.length, 2);
      stalled.env.cancel();
      await assert.rejects(stalled.result);
    });

    it('provider errors are counted per run and end the step at MAX_PROVIDER_ERRORS; a cancelled attempt counts nothing', async () => {
      const step = await summarizeStep(
        backend,
        (_request, n) => (n === 2 ? 'hang' : { status: 500, body: { error: 'upstream exploded' } }),
        { maxProviderErrors: 3 },
      );
      const transient = (err: unknown): boolean => {
        assert.ok(err instanceof ApplicationFailure, String(err));
        assert.equal(err.type, FailureType.TransientModelError);
        assert.equal(err.nonRetryable, false);
        return true;
      };

      await assert.rejects(step.attempt(1).result, transient);
      // Attempt 2 hangs and is cancelled, as when its worker is told to stop: not the provider's fault.
      const cancelled = step.attempt(2);
      await new Promise((resolve) => setTimeout(resolve, 300));
      cancelled.env.cancel();
      await assert.rejects(cancelled.result);
      await assert.rejects(step.attempt(3).result, transient);
      await assert.rejects(step.attempt(4).result, (err) => {
        assert.ok(err instanceof ApplicationFailure, String(err));
        assert.equal(err.type, FailureType.ProviderErrorsExhausted);
        assert.equal(err.nonRetryable, true);
        assert.match(
          err.message,
          /summarize failed after 3 attempts \(provider errors in this run; MAX_PROVIDER_ERRORS is 3\):/,
        );
        assert.match(err.message, /HTTP 500/);
        return true;
      });
      // A new run of the document (a resubmission) starts its own count.
      await assert.rejects(step.attempt(1, randomUUID()).result, transient);
      assert.equal(step.server.requests.length, 5);
    });

    it('a paid answer that was refused is kept with its tokens: the retry quotes the refusal, the result counts both', async () => {
      const cutOff = {
        body: {
          choices: [
            { index: 0, message: { role: 'assistant', content: 'Checkpoints let' }, finish_reason: 'length' },
          ],
          usage: { prompt_tokens: 100, completion_tokens: 50 },
        },
      };
      const step = await summarizeStep(backend, (_request, n) =>
        n === 1 ? cutOff : { body: completion(SUMMARY, { prompt_tokens: 120, completion_tokens: 20 }) },
      );

      await assert.rejects(step.attempt(1).result, (err) => {
        assert.ok(err instanceof ApplicationFailure, String(err));
        assert.equal(err.type, FailureType.ModelOutputInvalid);
        return true;
      });
      const result = await step.attempt(2).result;

      assert.deepEqual(result.usage, { inputTokens: 120, outputTokens: 20 });
      assert.deepEqual(result.rejectedUsage, { inputTokens: 100, outputTokens: 50 });
      const model = { provider: 'openai-compatible', model: 'test-model' } as const;
      const prices = { 'test-model': { inputPerMillion: 1, outputPerMillion: 4 } };
      const expected =
        (estimateCost(prices, model, { inputTokens: 100, outputTokens: 50 }) ?? NaN) +
        (estimateCost(prices, model, { inputTokens: 120, outputTokens: 20 }) ?? NaN);
      assert.ok(
        Math.abs((result.estimatedCostUsd ?? 0) - expected) < 1e-12,
        `cost ${result.estimatedCostUsd}`,
      );
      const [plain, retry] = step.server.requests.map((r) => ChatBodySchema.parse(r.body));
      assert.ok((plain?.max_tokens ?? 0) > 0, 'the first request did not cap the answer');
      assert.equal(retry?.max_tokens, plain?.max_tokens, 'the retry asked for another cap');
      const asked = retry?.messages.find((m) => m.role === 'user')?.content ?? '';
      assert.doesNotMatch(plain?.messages.find((m) => m.role === 'user')?.content ?? '', /refused/);
      assert.match(asked, /refused: model test-model was cut off/);

      // The attempt that stored the answer died before reporting: the next one reads it from the memo, and the
      // answer refused before it is still part of the step's cost.
      const memoised = await step.attempt(3).result;
      assert.equal(memoised.memoised, true);
      assert.deepEqual(memoised.rejectedUsage, { inputTokens: 100, outputTokens: 50 });
      assert.equal(memoised.estimatedCostUsd, result.estimatedCostUsd);
      assert.equal(step.server.requests.length, 2);
    });
  });
}
