import { setTimeout as sleep } from 'node:timers/promises';
import { ApplicationFailure } from '@temporalio/common';
import type { Logger } from '@temporalio/common';
import { z } from 'zod';
import { FailureType, UsageSchema } from '../contract';
import type { ModelInfo, Usage } from '../contract';
import { timed } from '../telemetry/phases';
import type { AnswerMemo, Claim, MemoRequest, RejectedAnswer, StoredAnswer } from './memo';
import { estimateCost, totalUsage } from './pricing';
import type { PriceTable, PriceTier } from './pricing';
import type { ModelAnswer } from './types';

/** A model step's answer as the memo settles it: the value, what it cost this run, and whether it was reused. */
export interface MemoAnswer<T> {
  value: T;
  usage: Usage;
  model: ModelInfo;
  memoised: boolean;
  estimatedCostUsd: number | null;
  rejectedUsage?: Usage;
  /** Bought in a provider batch (bulk mode): which one, and what the same answers would cost one call each. */
  bulk?: { claim: string; listCostUsd: number | null };
}

/** The owner's call to the model; `retryHint` quotes why the run's last paid answer was refused, if one was. */
export type OwnerCall<T> = (retryHint: string | undefined) => Promise<ModelAnswer<T>>;

export interface MemoCallOptions<T> {
  request: MemoRequest;
  memo: AnswerMemo;
  /** The model that answers: stored with its answer, and what the answer is priced by. */
  model: ModelInfo;
  /** The answer's shape: a memo entry that no longer fits it fails the step for good. */
  valueSchema: z.ZodType<T>;
  /** The step's identity (src/steps/identity.ts), stored with the answer. */
  identity?: string | undefined;
  /** This attempt's name on the claim (claimantName). */
  owner: string;
  /** The attempt's signal: a wait ends with it, and a paid answer's store stops retrying. */
  signal: AbortSignal;
  log: Logger;
  prices?: PriceTable | undefined;
  /** Life of a claim without renewal: how long a stalled or dead owner keeps others waiting. */
  leaseMs?: number | undefined;
  /** How often the owner renews its claim: as often as the attempt heartbeats (a third of the lease at most). */
  renewEveryMs: number;
  /** Provider errors one run's step may meet before it fails for good. */
  maxProviderErrors?: number | undefined;
}

const DEFAULT_LEASE_MS = 30_000;
const DEFAULT_MAX_PROVIDER_ERRORS = 6;
/** How often a waiting attempt looks at the memo again while another owns the claim. */
const WAIT_POLL_MS = 1_000;
/** Pause between tries to store a paid answer while the memo's database is out. */
const STORE_RETRY_MS = 1_000;

/** Usage a model client attaches to a failure when the provider answered (and was paid) but the answer was refused. */
const PaidFailureDetailsSchema = z.object({ paidUsage: UsageSchema });

/** A retryable refusal of an answer the provider was paid for: its usage rides along, so the cost counts it. */
export function paidButRefused(message: string, usage: Usage): ApplicationFailure {
  return ApplicationFailure.create({
    type: FailureType.ModelOutputInvalid,
    message,
    details: [{ paidUsage: usage }],
  });
}

/** The tokens of an answer the provider was paid for but the step refused (cut off, wrong shape), if `err` is one. */
export function paidUsageOf(err: unknown): Usage | undefined {
  if (!(err instanceof ApplicationFailure)) return undefined;
  const details = PaidFailureDetailsSchema.safeParse(err.details?.[0]);
  return details.success ? details.data.paidUsage : undefined;
}

type Answered = Extract<Claim, { kind: 'answered' }>;
type Owned = Extract<Claim, { kind: 'owned' }>;
type Held = Extract<Claim, { kind: 'held' }>;

/**
 * One attempt's way to a model step's answer through the memo of paid answers: dedupe before effect
 * (docs/recovery.md, "Dedupe before the model call"). The attempt claims the step's memo entry first; only the
 * owner of a live claim calls the model, renewing its lease while the call runs. An attempt that finds another's
 * live claim (a worker that stalled or lost its heartbeat mid-call and may still be paying) waits for that answer
 * instead of paying again, and takes over only when the lease runs out. The answer is stored before it is
 * returned, and what is returned is what the memo holds, so the history and the memo agree.
 *
 * Failures: a provider error is counted on the entry for this run, and past `maxProviderErrors` the step fails for
 * good; a crash or a stall counts nothing, since the attempt never gets to record it. A paid answer that was
 * refused (cut off, wrong shape) is recorded with its tokens, and the next attempt quotes its error to the model.
 */
export class MemoCall<T> {
  private readonly leaseMs: number;
  private readonly maxProviderErrors: number;
  private waitLogged = false;
  private renewFailed = false;

  constructor(private readonly options: MemoCallOptions<T>) {
    this.leaseMs = options.leaseMs ?? DEFAULT_LEASE_MS;
    this.maxProviderErrors = options.maxProviderErrors ?? DEFAULT_MAX_PROVIDER_ERRORS;
  }

  /**
   * The step's answer: the memo's when it holds one; another attempt's, waited for while that attempt's claim is
   * live; else this attempt's own, from `call`, stored before it is returned.
   */
  async answer(call: OwnerCall<T>): Promise<MemoAnswer<T>> {
    for (;;) {
      const claim = await this.claim();
      if (claim.kind === 'answered') return this.reuse(claim);
      if (claim.kind === 'owned') return this.callAsOwner(claim, call);
      await this.waitFor(claim);
    }
  }

  private claim(): Promise<Claim> {
    const { memo, request, owner } = this.options;
    return timed('memo claim', () => memo.claim(request, owner, this.leaseMs));
  }

  private reuse({ answer, rejected }: Answered): MemoAnswer<T> {
    const { step, memoKey } = this.options.request;
    this.options.log.info('Reusing the memoised model answer: it was paid for before', { step, memoKey });
    return this.settled(answer, true, rejected);
  }

  /** Another attempt owns a live claim (it is calling the model, or stalled mid-call): look again in a while. */
  private async waitFor(held: Held): Promise<void> {
    if (!this.waitLogged) {
      const { step, memoKey } = this.options.request;
      this.options.log.info('Another attempt is calling the model for this step; waiting for its answer', {
        step,
        memoKey,
        owner: held.owner,
        leaseUntil: held.leaseUntil.toISOString(),
      });
      this.waitLogged = true;
    }
    await sleep(WAIT_POLL_MS, undefined, { signal: this.options.signal });
  }

  /** Calls the model as the claim's owner and stores the answer, renewing the claim until it is stored. */
  private async callAsOwner(claim: Owned, call: OwnerCall<T>): Promise<MemoAnswer<T>> {
    // Renewed as often as the heartbeat, until the answer is stored: a stalled owner's claim then outlives the stall
    // by nearly the whole lease, and a database outage while the answer is stored does not let the claim lapse.
    const renewal = setInterval(
      () => void this.renew(),
      Math.min(this.leaseMs / 3, this.options.renewEveryMs),
    );
    try {
      const answer = await this.callModel(call, claim.rejected);
      const { identity } = this.options;
      const mine: StoredAnswer = {
        value: answer.value,
        usage: answer.usage,
        model: this.options.model,
        ...(identity === undefined ? {} : { identity }),
      };
      // Another attempt may have stored first (this one stalled past its lease): the stored answer is returned.
      const stored = await this.store(mine);
      return this.settled(stored, stored !== mine, claim.rejected);
    } finally {
      clearInterval(renewal);
    }
  }

  /** The model's answer, the retry quoting the run's last refused one; a failed call ends the claim (release). */
  private async callModel(call: OwnerCall<T>, rejected: RejectedAnswer[]): Promise<ModelAnswer<T>> {
    try {
      return await timed('model call', () => call(rejected.at(-1)?.error));
    } catch (err) {
      throw await this.release(err);
    }
  }

  /** Extends the lease; a failure is logged once and the next renewal tries again. */
  private async renew(): Promise<void> {
    const { memo, request, owner, log } = this.options;
    try {
      const held = await memo.renew(request.memoKey, owner, this.leaseMs);
      if (!held)
        log.warn('Lost the memo claim while calling the model (stalled past the lease)', {
          memoKey: request.memoKey,
        });
    } catch (err) {
      if (!this.renewFailed)
        log.warn('Could not renew the memo claim', { memoKey: request.memoKey, error: String(err) });
      this.renewFailed = true;
    }
  }

  /**
   * Stores a paid answer, trying again through a database outage for as long as the attempt lives: an answer
   * dropped here would be paid for again by the next attempt. Returns the answer the memo holds.
   */
  private async store(mine: StoredAnswer): Promise<StoredAnswer> {
    const { memo, request, signal, log } = this.options;
    for (let tries = 1; ; tries++) {
      try {
        return await timed('memo answer', () => memo.complete(request.memoKey, mine));
      } catch (err) {
        if (signal.aborted) throw err;
        if (tries === 1)
          log.warn('Could not store the paid model answer; trying again until the attempt ends', {
            memoKey: request.memoKey,
            error: String(err),
          });
        await sleep(STORE_RETRY_MS);
      }
    }
  }

  /**
   * Ends this attempt's claim after a failed call, keeping a refused paid answer with its tokens and counting a
   * provider error; returns what to throw, which past the run's provider errors fails the step for good.
   */
  private async release(err: unknown): Promise<unknown> {
    const { memo, request, owner } = this.options;
    const providerFailure = this.isProviderError(err);
    const rejected = this.refusedAnswer(err);
    const failures = await memo.release(request.memoKey, owner, {
      providerFailure,
      ...(rejected === undefined ? {} : { rejected }),
    });
    if (providerFailure && failures >= this.maxProviderErrors) return this.exhausted(err, failures);
    return err;
  }

  /** An error status, a timeout or a refused answer from the provider; not a cancellation nor a final refusal. */
  private isProviderError(err: unknown): err is ApplicationFailure {
    return (
      !this.options.signal.aborted &&
      err instanceof ApplicationFailure &&
      !err.nonRetryable &&
      (err.type === FailureType.TransientModelError || err.type === FailureType.ModelOutputInvalid)
    );
  }

  /** The answer the provider was paid for and the step refused, as the memo keeps it for this run. */
  private refusedAnswer(err: unknown): RejectedAnswer | undefined {
    const usage = paidUsageOf(err);
    if (usage === undefined || !(err instanceof ApplicationFailure)) return undefined;
    return { runId: this.options.request.runId, usage, model: this.options.model, error: err.message };
  }

  private exhausted(err: ApplicationFailure, failures: number): ApplicationFailure {
    const { step } = this.options.request;
    return ApplicationFailure.create({
      type: FailureType.ProviderErrorsExhausted,
      nonRetryable: true,
      message:
        `${step} failed after ${failures} attempts (provider errors in this run; MAX_PROVIDER_ERRORS is ` +
        `${this.maxProviderErrors}): ${err.message}. Check the provider, then submit the document again: answers ` +
        'already paid for are reused',
      cause: err,
    });
  }

  /** The step's answer from what the memo holds, priced with every answer this run paid for, kept or refused. */
  private settled(stored: StoredAnswer, memoised: boolean, rejected: RejectedAnswer[]): MemoAnswer<T> {
    const value = this.valueOf(stored);
    const refused = this.priced(rejected);
    const paid = [stored, ...rejected];
    return {
      value,
      usage: stored.usage,
      model: stored.model,
      memoised,
      estimatedCostUsd: this.priced(paid).costUsd,
      ...(rejected.length > 0
        ? { rejectedUsage: { inputTokens: refused.inputTokens, outputTokens: refused.outputTokens } }
        : {}),
      ...(stored.bulkClaim === undefined
        ? {}
        : { bulk: { claim: stored.bulkClaim, listCostUsd: this.priced(paid, 'direct').costUsd } }),
    };
  }

  /** The stored value in the step's shape; one that no longer fits fails the step for good. */
  private valueOf(stored: StoredAnswer): T {
    const value = this.options.valueSchema.safeParse(stored.value);
    if (value.success) return value.data;
    const { step, memoKey } = this.options.request;
    throw ApplicationFailure.create({
      type: FailureType.ModelOutputInvalid,
      nonRetryable: true,
      message:
        `the memo entry ${memoKey} holds an answer that does not fit the ${step} step's fields: its rules ` +
        "(`fields`) changed while what it asks stayed the same; change the step's answer schema or instructions " +
        'too (they make its identity), or run `npm run sweep` to clear old entries',
    });
  }

  /**
   * The tokens of paid answers and their estimated cost, each priced by the model that gave it, and at the batch
   * price when a provider batch bought it; `tier` 'direct' prices them all as one call each.
   */
  private priced(
    answers: (StoredAnswer | RejectedAnswer)[],
    tier?: PriceTier,
  ): ReturnType<typeof totalUsage> {
    const prices = this.options.prices ?? {};
    return totalUsage(
      answers.map((a) => ({
        usage: a.usage,
        estimatedCostUsd: estimateCost(
          prices,
          a.model,
          a.usage,
          tier ?? (a.bulkClaim === undefined ? 'direct' : 'batch'),
        ),
      })),
    );
  }
}
