import { Context, log } from '@temporalio/activity';
import type { Info } from '@temporalio/activity';
import type { Attributes } from '@opentelemetry/api';
import type { z } from 'zod';
import { claimantName } from '../src/lib/claimant';
import { memoKeyFor, memoRequestHash } from '../src/model/memo';
import type { AnswerMemo, MemoRequest } from '../src/model/memo';
import { MemoCall, paidUsageOf } from '../src/model/memo-call';
import type { MemoAnswer } from '../src/model/memo-call';
import { estimateCost } from '../src/model/pricing';
import type { PriceTable } from '../src/model/pricing';
import type { BudgetRef } from '../src/model/rate-limit-store';
import type { DocumentModel, ModelAnswer, ModelCall } from '../src/model/types';
import type { StepName, Usage } from '../src/contract';
import type { TextSource } from '../src/documents/text-source';
import { noMetrics } from '../src/telemetry/metrics';
import type { PipelineMetrics } from '../src/telemetry/metrics';
import { timed } from '../src/telemetry/phases';
import { genAiRequestAttributes, genAiUsageAttributes, inSpan } from '../src/telemetry/spans';
import { HEARTBEAT_EVERY_MS, withHeartbeats } from './heartbeat';
import { idempotencyKey } from './idempotency';

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
}

/** A model step's answer: the value, its tokens and cost for this run (refused answers too), and whether it was reused. */
export type ModelStepAnswer<T> = MemoAnswer<T>;

/** What a model step asks for: its name, the text by reference, what shapes the answer besides it, and its shape. */
export interface ModelStepOptions<T> {
  step: StepName;
  textRef: string;
  input: object;
  valueSchema: z.ZodType<T>;
  /** The run's or batch's budget the call draws on (not part of what shapes the answer, so not of the memo key). */
  budget?: BudgetRef | undefined;
}

/**
 * The body every model step shares: read the text by reference, then get the answer through the memo of paid
 * answers while heartbeating (src/model/memo-call.ts). `input` is what shapes the answer besides the text
 * (maxSentences, maxTags); with the text, the model and its prompt version it makes the memo key, so a resubmitted
 * document reuses what a failed run paid for, and a different request is never answered with another's answer.
 */
export async function runModelStep<T>(
  deps: ModelStepDependencies,
  { step, textRef, input, valueSchema, budget }: ModelStepOptions<T>,
  ask: (text: string, call: ModelCall) => Promise<ModelAnswer<T>>,
): Promise<ModelStepAnswer<T> & { idempotencyKey: string }> {
  const attemptStarted = Date.now();
  const { info } = Context.current();
  const key = idempotencyKey(info);
  const request = memoRequestOf(deps.model, info, key, step, { textRef, ...input });
  const pacing = { step, workflowId: request.workflowId, budget, ...deadlinesOf(info, attemptStarted) };
  const text = await timed('text read', () => deps.texts.read(textRef));
  const paid = new PaidCalls(deps, step, key);
  // Dedupe before effect: the attempt claims the step's memo entry, and only the claim's owner calls the model.
  const answer = await withHeartbeats((signal) =>
    memoCallOf(deps, request, valueSchema, `attempt-${info.attempt}`, signal).answer((retryHint) =>
      paid.call(() =>
        ask(text, {
          idempotencyKey: key,
          signal: callSignal(signal, attemptStarted),
          ...(retryHint === undefined ? {} : { retryHint }),
          pacing,
        }),
      ),
    ),
  );
  if (paid.count === 0) (deps.metrics ?? noMetrics).memoHit(step);
  return { ...answer, idempotencyKey: key };
}

/** Which request the memo entry answers: the workflow ID (not the run's), the step, and what shapes the answer. */
function memoRequestOf(
  model: DocumentModel,
  info: Info,
  key: string,
  step: StepName,
  input: object,
): MemoRequest {
  const workflowId = info.workflowExecution?.workflowId ?? info.activityId;
  const requestHash = memoRequestHash({ step, input, model: model.info, promptVersion: model.promptVersion });
  return {
    memoKey: memoKeyFor(workflowId, step, requestHash),
    workflowId,
    runId: info.workflowExecution?.runId ?? key,
    step,
    requestHash,
  };
}

/** This attempt's way to the answer through the memo, under a claim named for the attempt. */
function memoCallOf<T>(
  deps: ModelStepDependencies,
  request: MemoRequest,
  valueSchema: z.ZodType<T>,
  attempt: string,
  signal: AbortSignal,
): MemoCall<T> {
  return new MemoCall({
    request,
    memo: deps.memo,
    model: deps.model.info,
    valueSchema,
    owner: claimantName(attempt),
    signal,
    log,
    prices: deps.prices,
    leaseMs: deps.memoLeaseMs,
    renewEveryMs: HEARTBEAT_EVERY_MS,
    maxProviderErrors: deps.maxProviderErrors,
  });
}

/**
 * The model calls this attempt pays for, each a span of its own in the document's trace (the key and the model,
 * never the text). Tokens and cost are counted where they are spent, at each call, kept or refused: the step's
 * answer may come from the memo although this attempt paid too (another stored first), and a step that fails for
 * good has no answer to count from.
 */
class PaidCalls {
  count = 0;
  private readonly attributes: Attributes;

  constructor(
    private readonly deps: ModelStepDependencies,
    private readonly step: StepName,
    key: string,
  ) {
    const { provider, model } = deps.model.info;
    this.attributes = {
      'pipeline.step': step,
      'pipeline.idempotency_key': key,
      // The older name of the provider attribute, kept for dashboards that read it.
      'gen_ai.system': provider,
      ...genAiRequestAttributes({ provider, model }),
    };
  }

  /** Makes one call in its span, counting what the provider was paid even when the answer is refused. */
  call<T>(ask: () => Promise<ModelAnswer<T>>): Promise<ModelAnswer<T>> {
    return inSpan('model call', this.attributes, async (span) => {
      let paid: ModelAnswer<T>;
      try {
        paid = await ask();
      } catch (err) {
        const refused = paidUsageOf(err);
        if (refused !== undefined) this.counted(refused);
        throw err;
      }
      span.setAttributes(genAiUsageAttributes(paid.usage, this.counted(paid.usage)));
      return paid;
    });
  }

  /** Counts one paid answer's tokens and cost; returns the cost. */
  private counted(usage: Usage): number | null {
    this.count++;
    const cost = estimateCost(this.deps.prices ?? {}, this.deps.model.info, usage);
    (this.deps.metrics ?? noMetrics).modelPaid(this.step, this.deps.model.info, usage, cost);
    return cost;
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
