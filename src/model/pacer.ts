import { setTimeout as sleep } from 'node:timers/promises';
import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import { FailureType } from '../contract/plain';
import { UsageSchema } from '../contract';
import type { ModelInfo, Usage } from '../contract';
import { noMetrics } from '../telemetry/metrics';
import type { PipelineMetrics } from '../telemetry/metrics';
import { formatDelay } from '../telemetry/attempts';
import { estimateCost } from './pricing';
import type { PriceTable } from './pricing';
import { describeBudget, raiseCommand } from './pacing-status';
import { estimateTokens } from './rate-limit';
import { worstCaseTokens, worstCaseUsd } from './worst-case';
import type { CallEnd, LimitSettings, ProviderLimits } from './rate-limit';
import type { BudgetRef, BudgetStatus, Spent, SqlRateLimits } from './rate-limit-store';

/** Where a paced call stands in its step: what the pacing needs beyond the request itself. */
export interface CallPlace {
  /** The step's idempotency key: the call's place in the queue is kept under it across attempts. */
  holdKey: string;
  /** The run to wake when a budget it waits for is raised. */
  workflowId: string;
  step: string;
  budget?: BudgetRef | undefined;
  /**
   * What a budget's refusal of this call does: the run waits for a raise (`waits`, the default), or the agent loop
   * the call is a turn of ends with outcome `budget` and the run goes on without its answer (`ends-loop`).
   */
  onBudgetRefused?: 'waits' | 'ends-loop' | undefined;
  /** When this attempt's start-to-close timeout ends, on this worker's clock; Infinity when it has none. */
  attemptEndsAt: number;
  /** When the step's whole budget (schedule-to-close) ends, on this worker's clock; Infinity when it has none. */
  stepEndsAt: number;
  signal: AbortSignal;
}

/** One request as the pacing sees it: its size, and how to send it. */
export interface PacedRequest<T> {
  /** Characters of the prompt (instructions and text) and the most tokens the answer may use. */
  promptChars: number;
  /**
   * UTF-8 bytes of everything the request sends (the system line, the messages, the answer's schema): the bound
   * its budget holds (worst-case.ts). Absent, three bytes a character (a UTF-16 unit is at most three).
   */
  promptBytes?: number | undefined;
  maxOutputTokens: number;
  send(): Promise<{ value: T; usage: Usage; limits: ProviderLimits }>;
}

/** The provider's push-back, as a model client reports it: a ProviderBusy failure with these details. */
export const BusyDetailsSchema = z.object({
  overloaded: z.boolean(),
  retryAfterMs: z.number().optional(),
  limits: z.custom<ProviderLimits>((v) => typeof v === 'object' && v !== null),
});
export type BusyDetails = z.infer<typeof BusyDetailsSchema>;

/** The details of a budget's refusal, for the workflow and the CLI. */
export interface BudgetDetails {
  budget: BudgetStatus;
  needed: { tokens: number; usd: number };
}

/** A model call's spending the provider was paid for but the step refused: the client attaches it (ai-sdk.ts). */
const PaidDetailsSchema = z.object({ paidUsage: UsageSchema });

/**
 * A failure the provider answered with a refusal of the request itself (a 4xx but 408 and 429): nothing was served,
 * nothing billed. The client attaches it (ai-sdk.ts); any other failure after a send may have been billed.
 */
export const NOT_BILLED = { notBilled: true } as const;
const NotBilledSchema = z.object({ notBilled: z.literal(true) });

interface Logger {
  info(message: string, attributes?: Record<string, unknown>): void;
  warn(message: string, attributes?: Record<string, unknown>): void;
}

/** Longest wait for a turn inside an attempt; a longer one ends the attempt and waits outside it. */
const MAX_INLINE_WAIT_MS = 60_000;
/** Calls of this process that may wait for their turn inside an attempt (each holds an activity slot). */
const MAX_INLINE_WAITERS = 32;
/** How long before its turn an attempt that waited outside comes back. */
const EARLY_RETURN_MS = 2_000;
/** How often a call waiting for its turn reads it again. */
const TURN_READ_MS = 1_000;
/** The longest a call whose turn came waits for room among the fleet's sends (admit) before it queues again. */
const MAX_ADMIT_WAIT_MS = 1_000;
/** Room left after a turn for the call itself, before the attempt's own timeout. */
const CALL_ROOM_MS = 15_000;

/**
 * Paces a provider's calls for the whole fleet (rate-limit-store.ts) and keeps them within their budget. Each
 * call takes a turn before it is sent, waits for it (heartbeating: the caller's heartbeats go on), and reports how
 * it ended. A refusal (429) or an "overloaded" answer is back-pressure: the call takes a new turn and goes again,
 * in the same attempt while the attempt has room, never counted as a provider error. A turn further off than the
 * attempt should wait ends the attempt with ProviderBusy and the time to come back: the place is kept under the
 * step's key, and the worker's slot is free for publishes and other providers meanwhile.
 */
export class Pacer {
  private inlineWaiters = 0;

  constructor(
    private readonly limits: SqlRateLimits,
    private readonly scope: string,
    private readonly model: ModelInfo,
    private readonly options: {
      prices?: PriceTable | undefined;
      metrics?: PipelineMetrics | undefined;
      /** A call's place is kept this long after its start time: the longest a call may take, and then some. */
      leaseMs: number;
      /** The operator's limits (MODEL_RPM, MODEL_TPM, MODEL_MAX_CONCURRENT). */
      settings: LimitSettings;
      log: Logger;
    },
  ) {}

  async run<T>(place: CallPlace, request: PacedRequest<T>): Promise<{ value: T; usage: Usage }> {
    const metrics = this.options.metrics ?? noMetrics;
    for (;;) {
      const charsPerToken = await this.limits.charsPerToken(this.scope);
      // The pacing's likely tokens; the budget holds the most the provider may bill (worst-case.ts).
      const tokens = estimateTokens(request.promptChars, request.maxOutputTokens, charsPerToken);
      const budgetTokens = worstCaseTokens(
        request.promptBytes ?? 3 * request.promptChars,
        request.maxOutputTokens,
      );
      const priced = worstCaseUsd(
        this.options.prices ?? {},
        this.model,
        budgetTokens - request.maxOutputTokens,
        request.maxOutputTokens,
      );
      if (priced === null && place.budget?.usd !== undefined) {
        throw ApplicationFailure.create({
          type: FailureType.InvalidInput,
          nonRetryable: true,
          message:
            `budget ${place.budget.id} is in dollars, and the price table has no price for model ` +
            `${this.model.model}: add it to MODEL_PRICES (docs/cost.md), or give the budget in tokens`,
        });
      }
      const usd = priced ?? 0;
      const turn = await this.limits.reserve(
        {
          scope: this.scope,
          holdKey: place.holdKey,
          tokens,
          budgetTokens,
          usd,
          budget: place.budget,
          workflowId: place.workflowId,
          leaseMs: this.options.leaseMs,
        },
        this.options.settings,
      );
      if (turn.kind === 'budget') throw budgetFailure(place, turn.budget, { tokens: budgetTokens, usd });
      if (turn.kind === 'busy' || turn.kind === 'promised') {
        // 'promised': it fits once calls under way end (they spend what they used and give back the rest).
        await this.wait(place, turn.retryInMs, metrics);
        continue;
      }
      const hold = { holdKey: place.holdKey, nonce: turn.nonce };
      try {
        await this.wait(place, turn.waitMs, metrics, hold);
      } catch (err) {
        // A step that fails for good waiting (past its step budget) gives its turn up; one that goes to wait
        // outside the attempt keeps it for the next attempt.
        if (err instanceof ApplicationFailure && err.nonRetryable)
          await this.end(place, turn.nonce, { kind: 'unanswered' });
        throw err;
      }
      if (!(await this.admitted(place, hold, tokens, metrics))) {
        // No room among the fleet's sends soon (a worker held up past its turn sends together with the calls whose
        // turns fell in the delay; a refusal since holds the fleet back): it queues again, its turn left unused.
        await this.end(place, turn.nonce, { kind: 'unanswered' });
        continue;
      }
      const sentAt = Date.now();
      let answer: { value: T; usage: Usage; limits: ProviderLimits };
      try {
        answer = await request.send();
      } catch (err) {
        const busy = busyDetailsOf(err);
        if (busy !== undefined) {
          await this.end(place, turn.nonce, {
            kind: 'refused',
            overloaded: busy.overloaded,
            retryAfterMs: busy.retryAfterMs,
            limits: busy.limits,
            elapsedMs: Date.now() - sentAt,
          });
          metrics.modelRefused(place.step, this.model, busy.overloaded ? 'overloaded' : 'rate_limited');
          this.options.log.info('The provider is limiting calls; this call waits its turn and goes again', {
            step: place.step,
            answer: busy.overloaded ? 'overloaded' : '429',
            retryAfterMs: busy.retryAfterMs,
          });
          continue;
        }
        const detail = err instanceof ApplicationFailure ? err.details?.[0] : undefined;
        const paid = PaidDetailsSchema.safeParse(detail);
        // No answer to read the bill from (a timeout, a reset, a 5xx, a cancelled attempt): the provider may have
        // served and billed it, so its budget is charged what it held, the most it may have cost.
        const spent = paid.success
          ? this.spent(paid.data.paidUsage, request.promptChars)
          : NotBilledSchema.safeParse(detail).success
            ? undefined
            : 'held';
        await this.end(
          place,
          turn.nonce,
          paid.success
            ? this.answered(tokens, paid.data.paidUsage, {}, Date.now() - sentAt)
            : { kind: 'unanswered' },
          spent,
        );
        throw err;
      }
      await this.end(
        place,
        turn.nonce,
        this.answered(tokens, answer.usage, answer.limits, Date.now() - sentAt),
        this.spent(answer.usage, request.promptChars),
      );
      return { value: answer.value, usage: answer.usage };
    }
  }

  /** Waits, briefly, for room among the fleet's sends; false when it would take longer (or the hold is gone). */
  private async admitted(
    place: CallPlace,
    hold: { holdKey: string; nonce: string },
    tokens: number,
    metrics: PipelineMetrics,
  ): Promise<boolean> {
    for (;;) {
      const answer = await this.limits.admit(this.scope, hold, { tokens }, this.options.settings);
      if (answer.kind === 'send') return true;
      if (answer.kind === 'gone' || answer.waitMs > MAX_ADMIT_WAIT_MS) return false;
      await this.wait(place, answer.waitMs, metrics);
    }
  }

  private answered(reserved: number, usage: Usage, limits: ProviderLimits, elapsedMs: number) {
    return {
      kind: 'answered' as const,
      reservedTokens: reserved,
      usedTokens: usage.inputTokens + usage.outputTokens,
      limits,
      elapsedMs,
    };
  }

  private spent(usage: Usage, promptChars: number) {
    return {
      tokens: usage.inputTokens + usage.outputTokens,
      usd: estimateCost(this.options.prices ?? {}, this.model, usage) ?? 0,
      promptChars,
      inputTokens: usage.inputTokens,
    };
  }

  /**
   * Waits `ms` (with a little jitter, so waiters given one time do not return together) inside the attempt, or
   * ends the attempt to wait outside it when the wait is long, the attempt has no room left for it, or enough of
   * this process's slots wait already.
   */
  private async wait(
    place: CallPlace,
    ms: number,
    metrics: PipelineMetrics,
    hold?: { holdKey: string; nonce: string },
  ): Promise<void> {
    if (ms <= 0) return;
    const waitMs = ms + Math.random() * Math.min(250, ms * 0.1);
    const now = Date.now();
    if (now + waitMs > place.stepEndsAt) {
      throw ApplicationFailure.create({
        type: FailureType.ProviderBusy,
        nonRetryable: true,
        message:
          `${place.step} would wait ${formatDelay(waitMs)} for the provider's limit (${this.scope}), past the ` +
          "step's budget: raise STEP_BUDGET_MINUTES, send fewer documents at once, or raise the provider's limit",
      });
    }
    const inline =
      waitMs <= MAX_INLINE_WAIT_MS &&
      now + waitMs + CALL_ROOM_MS <= place.attemptEndsAt &&
      this.inlineWaiters < MAX_INLINE_WAITERS;
    if (!inline) {
      // Counted now: the wait happens between this attempt and the next, which the server schedules.
      metrics.limiterWaited(this.model, waitMs / 1000);
      throw ApplicationFailure.create({
        type: FailureType.ProviderBusy,
        message: `${place.step} waits ${formatDelay(waitMs)} for its turn at the provider's limit (${this.scope})`,
        // A little before the turn: the next attempt finds its place kept and waits out the rest inside, so the
        // server's dispatch, however late, does not make it miss its turn.
        nextRetryDelay: Math.ceil(Math.max(waitMs / 2, waitMs - EARLY_RETURN_MS)),
      });
    }
    this.inlineWaiters++;
    try {
      // The turn moves while it waits (the provider's counts move the queue): it is read again every second.
      for (let left = waitMs; left > 0;) {
        await sleep(Math.min(left, TURN_READ_MS), undefined, { signal: place.signal });
        if (left <= TURN_READ_MS || hold === undefined) return;
        const moved = await this.limits.turn(hold).catch(() => left - TURN_READ_MS);
        left = moved ?? 0;
      }
    } finally {
      this.inlineWaiters--;
      metrics.limiterWaited(this.model, (Date.now() - now) / 1000);
    }
  }

  /** Reports a call's end, through a brief outage of the store: it settles the budget and teaches the pacing. */
  private async end(place: CallPlace, nonce: string, end: CallEnd, spent?: Spent | 'held'): Promise<void> {
    for (let tries = 1; ; tries++) {
      try {
        await this.limits.end(
          this.scope,
          { holdKey: place.holdKey, nonce },
          end,
          this.options.settings,
          spent,
        );
        return;
      } catch (err) {
        if (tries >= 5 || place.signal.aborted) {
          this.options.log.warn('Could not record the end of a model call with the pacing', {
            step: place.step,
            error: String(err),
          });
          return;
        }
        await sleep(500 * tries);
      }
    }
  }
}

/** The push-back a ProviderBusy failure carries, if `err` is one. */
export function busyDetailsOf(err: unknown): BusyDetails | undefined {
  if (!(err instanceof ApplicationFailure) || err.type !== FailureType.ProviderBusy) return undefined;
  const details = BusyDetailsSchema.safeParse(err.details?.[0]);
  return details.success ? details.data : undefined;
}

function budgetFailure(
  place: CallPlace,
  budget: BudgetStatus,
  needed: { tokens: number; usd: number },
): ApplicationFailure {
  const details: BudgetDetails = { budget, needed };
  const then =
    place.onBudgetRefused === 'ends-loop'
      ? 'the agent loop ends with outcome budget and the run goes on without its answer; for the next runs, raise it with '
      : 'the run waits; raise it with ';
  return ApplicationFailure.create({
    type: FailureType.BudgetExhausted,
    nonRetryable: true,
    message:
      `${place.step} would pass budget ${budget.id} (${describeBudget(budget)}; this call may cost up to ` +
      `${needed.tokens} tokens, $${needed.usd.toFixed(4)}): ${then}` +
      raiseCommand(budget, needed),
    details: [details],
  });
}
