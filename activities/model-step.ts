import { setTimeout as sleep } from 'node:timers/promises';
import { ApplicationFailure, Context, log } from '@temporalio/activity';
import type { Info } from '@temporalio/activity';
import { z } from 'zod';
import { claimantName } from '../src/lib/claimant';
import { memoKeyFor, memoRequestHash } from '../src/model/memo';
import type { AnswerMemo, MemoRequest, RejectedAnswer, StoredAnswer } from '../src/model/memo';
import { estimateCost, totalUsage } from '../src/model/pricing';
import type { PriceTable } from '../src/model/pricing';
import type { BudgetRef } from '../src/model/rate-limit-store';
import type { DocumentModel, ModelAnswer, ModelCall } from '../src/model/types';
import { FailureType, UsageSchema } from '../src/contract';
import type { ModelInfo, StepName, Usage } from '../src/contract';
import type { TextSource } from '../src/documents/text-source';
import { noMetrics } from '../src/telemetry/metrics';
import type { PipelineMetrics } from '../src/telemetry/metrics';
import { genAiRequestAttributes, genAiUsageAttributes, inSpan } from '../src/telemetry/spans';
import { HEARTBEAT_EVERY_MS, withHeartbeats } from './heartbeat';
import { idempotencyKey } from './idempotency';
import { timed } from './phases';
import type { PhaseTimer } from './phases';

/** What the two model steps need: the model, the memo of paid answers, the texts, prices, and the budgets. */
export interface ModelStepDependencies {
  model: DocumentModel;
  memo: AnswerMemo;
  texts: TextSource;
  prices?: PriceTable;
  /** Life of a memo claim without renewal: how long a stalled or dead owner keeps others waiting. */
  memoLeaseMs?: number;
  /** Provider errors (error statuses, timeouts, refused answers) one run's step may meet before it fails. */
  maxProviderErrors?: number;
  /** Where tokens, cost and memo hits are counted (the worker's metrics page); nowhere by default. */
  metrics?: PipelineMetrics;
  /** Times each phase of a step (npm run bench's breakdown); nothing is timed without it. */
  phases?: PhaseTimer;
}

export interface ModelStepAnswer<T> {
  value: T;
  usage: Usage;
  model: ModelInfo;
  memoised: boolean;
  estimatedCostUsd: number | null;
  rejectedUsage?: Usage;
}

const DEFAULT_LEASE_MS = 30_000;
const DEFAULT_MAX_PROVIDER_ERRORS = 6;
/** How often a waiting attempt looks at the memo again while another owns the claim. */
const WAIT_POLL_MS = 1_000;
/** Pause between tries to store a paid answer while the memo's database is out. */
const STORE_RETRY_MS = 1_000;

/** Usage a model client attaches to a failure when the provider answered (and was paid) but the answer was refused. */
const PaidFailureDetailsSchema = z.object({ paidUsage: UsageSchema });

/**
 * The body shared by summarize and tag: read the text by reference, then get the answer through the memo while
 * heartbeating (see askOnce). `input` is what shapes the answer besides the text (maxSentences, maxTags); with the
 * text, the model and its prompt version it makes the memo key, so a resubmitted document reuses what a failed
 * run paid for, and a different request is never answered with another's answer.
 */
export async function runModelStep<T>(
  deps: ModelStepDependencies,
  {
    step,
    textRef,
    input,
    valueSchema,
    budget,
  }: {
    step: StepName;
    textRef: string;
    input: object;
    valueSchema: z.ZodType<T>;
    /** The run's or batch's budget the call draws on (not part of what shapes the answer, so not of the memo key). */
    budget?: BudgetRef | undefined;
  },
  ask: (text: string, call: ModelCall) => Promise<ModelAnswer<T>>,
): Promise<ModelStepAnswer<T> & { idempotencyKey: string }> {
  const attemptStarted = Date.now();
  const info = Context.current().info;
  const key = idempotencyKey(info);
  const workflowId = info.workflowExecution?.workflowId ?? info.activityId;
  const requestHash = memoRequestHash({
    step,
    input: { textRef, ...input },
    model: deps.model.info,
    promptVersion: deps.model.promptVersion,
  });
  const request: MemoRequest = {
    memoKey: memoKeyFor(workflowId, step, requestHash),
    workflowId,
    runId: info.workflowExecution?.runId ?? key,
    step,
    requestHash,
  };
  const text = await timed(deps.phases, 'text read', () => deps.texts.read(textRef));
  // The paid call is a span of its own in the document's trace: the key and the model, never the text.
  const { provider, model } = deps.model.info;
  const callAttributes = {
    'pipeline.step': step,
    'pipeline.idempotency_key': key,
    // The older name of the provider attribute, kept for dashboards that read it.
    'gen_ai.system': provider,
    ...genAiRequestAttributes({ provider, model }),
  };
  // Tokens and cost are counted where they are spent, at each call this attempt paid for, kept or refused: the
  // step's answer may come from the memo although this attempt paid too (another stored first), and a step that
  // fails for good has no answer to count from.
  const metrics = deps.metrics ?? noMetrics;
  let paidCalls = 0;
  const counted = (usage: Usage): void => {
    paidCalls++;
    metrics.modelPaid(step, deps.model.info, usage, estimateCost(deps.prices ?? {}, deps.model.info, usage));
  };
  const answer = await withHeartbeats((signal) =>
    askOnce(
      { ...deps, step, request, valueSchema, owner: claimantName(`attempt-${info.attempt}`), signal },
      (retryHint) =>
        inSpan('model call', callAttributes, async (span) => {
          let paid: ModelAnswer<T>;
          try {
            paid = await ask(text, {
              idempotencyKey: key,
              signal: callSignal(signal, attemptStarted),
              ...(retryHint === undefined ? {} : { retryHint }),
              pacing: { step, workflowId, budget, ...deadlinesOf(info, attemptStarted) },
            });
          } catch (err) {
            const refused = paidUsageOf(err);
            if (refused !== undefined) counted(refused);
            throw err;
          }
          counted(paid.usage);
          span.setAttributes(
            genAiUsageAttributes(paid.usage, estimateCost(deps.prices ?? {}, deps.model.info, paid.usage)),
          );
          return paid;
        }),
    ),
  );
  if (paidCalls === 0) metrics.memoHit(step);
  return { ...answer, idempotencyKey: key };
}

/** The tokens of an answer the provider was paid for but the step refused (cut off, wrong shape), if `err` is one. */
function paidUsageOf(err: unknown): Usage | undefined {
  if (!(err instanceof ApplicationFailure)) return undefined;
  const details = PaidFailureDetailsSchema.safeParse(err.details?.[0]);
  return details.success ? details.data.paidUsage : undefined;
}

/**
 * Dedupe before effect. The attempt first claims the step's memo entry; only the owner of a live claim calls the
 * model, renewing its lease while the call runs. An attempt that finds another's live claim (a worker that stalled
 * or lost its heartbeat mid-call and may still be paying) waits for that answer instead of paying again, and
 * takes over only when the lease runs out. The answer is stored before it is returned, and what is returned is
 * what the memo holds, so the history and the memo agree.
 *
 * Failures: a provider error is counted on the entry for this run, and past `maxProviderErrors` the step fails for
 * good; a crash or a stall counts nothing, since the activity never gets to record it. A paid answer that was
 * refused (cut off, wrong shape) is recorded with its tokens, and the next attempt quotes its error to the model.
 */
export async function askOnce<T>(
  {
    step,
    request,
    memo,
    model,
    valueSchema,
    owner,
    signal,
    prices = {},
    memoLeaseMs = DEFAULT_LEASE_MS,
    maxProviderErrors = DEFAULT_MAX_PROVIDER_ERRORS,
    phases,
  }: {
    step: StepName;
    request: MemoRequest;
    memo: AnswerMemo;
    model: DocumentModel;
    valueSchema: z.ZodType<T>;
    owner: string;
    signal: AbortSignal;
    prices?: PriceTable;
    memoLeaseMs?: number;
    maxProviderErrors?: number;
    phases?: PhaseTimer | undefined;
  },
  ask: (retryHint: string | undefined) => Promise<ModelAnswer<T>>,
): Promise<ModelStepAnswer<T>> {
  const { memoKey } = request;
  let waitingLogged = false;
  for (;;) {
    const claim = await timed(phases, 'memo claim', () => memo.claim(request, owner, memoLeaseMs));
    if (claim.kind === 'answered') {
      log.info('Reusing the memoised model answer: it was paid for before', { step, memoKey });
      return fromMemo(claim.answer, true, claim.rejected);
    }
    if (claim.kind === 'held') {
      if (!waitingLogged) {
        log.info('Another attempt is calling the model for this step; waiting for its answer', {
          step,
          memoKey,
          owner: claim.owner,
          leaseUntil: claim.leaseUntil.toISOString(),
        });
        waitingLogged = true;
      }
      await sleep(WAIT_POLL_MS, undefined, { signal });
      continue;
    }
    // Renewed as often as the heartbeat, until the answer is stored: a stalled owner's claim then outlives the stall
    // by nearly the whole lease, and a database outage while the answer is stored does not let the claim lapse.
    let renewFailed = false;
    const renewal = setInterval(
      () => {
        memo.renew(memoKey, owner, memoLeaseMs).then(
          (held) => {
            if (!held)
              log.warn('Lost the memo claim while calling the model (stalled past the lease)', { memoKey });
          },
          (err: unknown) => {
            if (!renewFailed) log.warn('Could not renew the memo claim', { memoKey, error: String(err) });
            renewFailed = true;
          },
        );
      },
      Math.min(memoLeaseMs / 3, HEARTBEAT_EVERY_MS),
    );
    try {
      let answer: ModelAnswer<T>;
      try {
        answer = await timed(phases, 'model call', () => ask(claim.rejected.at(-1)?.error));
      } catch (err) {
        throw await releaseAfter(err);
      }
      const mine: StoredAnswer = { value: answer.value, usage: answer.usage, model: model.info };
      // Another attempt may have stored first (this one stalled past its lease): the stored answer is returned.
      const stored = await storeAnswer(mine);
      return fromMemo(stored, stored !== mine, claim.rejected);
    } finally {
      clearInterval(renewal);
    }
  }

  /**
   * Stores a paid answer, trying again through a database outage for as long as the attempt lives: an answer
   * dropped here would be paid for again by the next attempt.
   */
  async function storeAnswer(mine: StoredAnswer): Promise<StoredAnswer> {
    for (let tries = 1; ; tries++) {
      try {
        return await timed(phases, 'memo answer', () => memo.complete(memoKey, mine));
      } catch (err) {
        if (signal.aborted) throw err;
        if (tries === 1)
          log.warn('Could not store the paid model answer; trying again until the attempt ends', {
            memoKey,
            error: String(err),
          });
        await sleep(STORE_RETRY_MS);
      }
    }
  }

  function fromMemo(stored: StoredAnswer, memoised: boolean, rejected: RejectedAnswer[]): ModelStepAnswer<T> {
    const value = valueSchema.safeParse(stored.value);
    if (!value.success) {
      throw ApplicationFailure.create({
        type: FailureType.ModelOutputInvalid,
        nonRetryable: true,
        message:
          `the memo entry ${memoKey} holds an answer that does not fit the ${step} step's schema; when a step's ` +
          "answer changes shape, bump its model's promptVersion so old entries stop matching",
      });
    }
    // Every answer this run paid for, kept or refused, with its price: their sum is the step's cost.
    const priced = (a: StoredAnswer | RejectedAnswer) => ({
      usage: a.usage,
      estimatedCostUsd: estimateCost(prices, a.model, a.usage),
    });
    const refused = totalUsage(rejected.map(priced));
    return {
      value: value.data,
      usage: stored.usage,
      model: stored.model,
      memoised,
      estimatedCostUsd: totalUsage([stored, ...rejected].map(priced)).costUsd,
      ...(rejected.length > 0
        ? { rejectedUsage: { inputTokens: refused.inputTokens, outputTokens: refused.outputTokens } }
        : {}),
    };
  }

  /** Ends this attempt's claim, counting a provider error; past the budget the step fails for good. */
  async function releaseAfter(err: unknown): Promise<unknown> {
    const providerError =
      !signal.aborted &&
      err instanceof ApplicationFailure &&
      !err.nonRetryable &&
      (err.type === FailureType.TransientModelError || err.type === FailureType.ModelOutputInvalid);
    const paidUsage = paidUsageOf(err);
    const rejected =
      paidUsage !== undefined && err instanceof ApplicationFailure
        ? { runId: request.runId, usage: paidUsage, model: model.info, error: err.message }
        : undefined;
    const failures = await memo.release(memoKey, owner, {
      providerFailure: providerError,
      ...(rejected === undefined ? {} : { rejected }),
    });
    if (providerError && failures >= maxProviderErrors) {
      return ApplicationFailure.create({
        type: FailureType.ProviderErrorsExhausted,
        nonRetryable: true,
        message:
          `${step} failed after ${failures} attempts (provider errors in this run; MAX_PROVIDER_ERRORS is ` +
          `${maxProviderErrors}): ${err.message}. Check the provider, then submit the document again: answers ` +
          'already paid for are reused',
        cause: err,
      });
    }
    return err;
  }
}

/** The attempt's start-to-close deadline and the step's schedule-to-close one, on this worker's clock. */
function deadlinesOf(
  info: Pick<Info, 'startToCloseTimeoutMs' | 'scheduleToCloseTimeoutMs' | 'scheduledTimestampMs'>,
  attemptStarted: number,
): { attemptEndsAt: number; stepEndsAt: number } {
  return {
    attemptEndsAt: info.startToCloseTimeoutMs > 0 ? attemptStarted + info.startToCloseTimeoutMs : Infinity,
    stepEndsAt:
      info.scheduleToCloseTimeoutMs > 0
        ? info.scheduledTimestampMs + info.scheduleToCloseTimeoutMs
        : Infinity,
  };
}

/**
 * The signal a model call gets: the attempt's, except when the server has given up on the attempt before its
 * start-to-close timeout (a stall past the heartbeat timeout: a GC pause, a frozen VM, a server that was down; the
 * attempt learns so on waking). Such a call is not cut off: its answer may be in the socket already, or on its way,
 * and paid for either way, while the attempt that took over waits on this attempt's claim, still renewed; storing
 * that answer is what keeps it from paying again. It may run until the attempt's own start-to-close deadline, the
 * time the step gives a model call (modelTimeoutSeconds, reckoned from `attemptStarted` on this worker's clock), or
 * end sooner at the model client's request timeout; either releases the claim. A call still going at that
 * deadline is hung, and is stopped. A cancellation the workflow asked for, or a worker shutting down, stops the
 * call at once. (A fixed grace of one second paid twice whenever the answer came later, as on a loaded machine.)
 */
function callSignal(attempt: AbortSignal, attemptStarted: number, context = Context.current()): AbortSignal {
  const call = new AbortController();
  const follow = (): void => {
    const details = context.cancellationDetails;
    if (details?.notFound === true || details?.timedOut === true) {
      const { startToCloseTimeoutMs } = context.info;
      const left = startToCloseTimeoutMs > 0 ? attemptStarted + startToCloseTimeoutMs - Date.now() : Infinity;
      if (left <= 0) call.abort(attempt.reason);
      else if (Number.isFinite(left)) setTimeout(() => call.abort(attempt.reason), left).unref();
      return;
    }
    call.abort(attempt.reason);
  };
  if (attempt.aborted) follow();
  else attempt.addEventListener('abort', follow, { once: true });
  return call.signal;
}
