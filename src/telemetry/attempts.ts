/**
 * What each step attempt tells the logs and the metrics: a rerun is counted, and a failed attempt is one log line
 * with its reason and when Temporal will try again (the stack only at LOG_LEVEL=debug), instead of the SDK's
 * warning with the whole stack for every attempt while a webhook is down.
 */
import type { Context, Info } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { msOptionalToNumber } from '@temporalio/common/lib/time';
import type {
  ActivityExecuteInput,
  ActivityInboundCallsInterceptor,
  ActivityInterceptorsFactory,
  Next,
} from '@temporalio/worker';
import { FailureType } from '../contract/plain';
import type { PipelineMetrics } from './metrics';

/** Temporal's defaults for an activity retry policy left unset. */
const DEFAULT_INITIAL_MS = 1_000;
const DEFAULT_COEFFICIENT = 2;

/** When a failed attempt is tried again (unknown when the server did not send the policy), or why it is not. */
export type NextAttempt =
  | { retried: true; at: Date; inMs: number }
  | { retried: true; at: undefined }
  | { retried: false; why: string };

/**
 * The next attempt after `err` ends attempt `info.attempt` at `now`, as the server will schedule it: the failure's
 * own delay (a 429's Retry-After) or the policy's backoff, unless the failure is non-retryable, the attempts are
 * used up, or the next one would start past the step's schedule-to-close budget.
 */
export function nextAttempt(
  info: Pick<Info, 'attempt' | 'retryPolicy' | 'scheduledTimestampMs' | 'scheduleToCloseTimeoutMs'>,
  err: unknown,
  now: number,
): NextAttempt {
  const policy = info.retryPolicy;
  const type = err instanceof ApplicationFailure ? err.type : err instanceof Error ? err.name : undefined;
  if (err instanceof ApplicationFailure && err.nonRetryable) return { retried: false, why: 'non-retryable' };
  if (type != null && policy?.nonRetryableErrorTypes?.includes(type))
    return { retried: false, why: `non-retryable ${type}` };
  if (
    policy?.maximumAttempts !== undefined &&
    policy.maximumAttempts > 0 &&
    info.attempt >= policy.maximumAttempts
  ) {
    return { retried: false, why: `all ${policy.maximumAttempts} attempts used` };
  }
  const ownDelay =
    err instanceof ApplicationFailure ? msOptionalToNumber(err.nextRetryDelay ?? undefined) : undefined;
  // Older servers (and the time-skipping test server) do not send the policy: then only the failure's own delay says.
  if (ownDelay === undefined && policy === undefined) return { retried: true, at: undefined };
  const initial = msOptionalToNumber(policy?.initialInterval) ?? DEFAULT_INITIAL_MS;
  const coefficient = policy?.backoffCoefficient ?? DEFAULT_COEFFICIENT;
  const maximum = msOptionalToNumber(policy?.maximumInterval) ?? 100 * initial;
  const inMs = ownDelay ?? Math.min(initial * coefficient ** (info.attempt - 1), maximum);
  const budget = info.scheduleToCloseTimeoutMs;
  if (budget > 0 && now + inMs > info.scheduledTimestampMs + budget) {
    return {
      retried: false,
      why: `the step's ${formatDelay(budget)} budget would be over before the next attempt`,
    };
  }
  return { retried: true, at: new Date(now + inMs), inMs };
}

/** A retryable ProviderBusy failure: the provider's push-back or the pacing's turn, never a fault. */
function isBackPressure(err: unknown): boolean {
  return err instanceof ApplicationFailure && err.type === FailureType.ProviderBusy && !err.nonRetryable;
}

/** `850 ms`, `20 s`, `4 min`, `2 h`: a delay for a person. */
export function formatDelay(ms: number): string {
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  if (ms < 120_000) return `${Math.round(ms / 1_000)} s`;
  if (ms < 7_200_000) return `${Math.round(ms / 60_000)} min`;
  return `${Math.round(ms / 3_600_000)} h`;
}

/** The activity interceptor that reports attempts to `metrics` and to the activity's logger. */
export function attemptReporting(metrics: PipelineMetrics): ActivityInterceptorsFactory {
  return (ctx) => ({ inbound: new AttemptReporter(ctx, metrics) });
}

class AttemptReporter implements ActivityInboundCallsInterceptor {
  constructor(
    private readonly ctx: Context,
    private readonly metrics: PipelineMetrics,
  ) {}

  async execute(
    input: ActivityExecuteInput,
    next: Next<ActivityInboundCallsInterceptor, 'execute'>,
  ): Promise<unknown> {
    const { info, log } = this.ctx;
    if (info.attempt > 1) this.metrics.stepRerun(info.activityType);
    try {
      return await next(input);
    } catch (err) {
      // A cancelled attempt (shutdown, the server's cancel) did not fail: the SDK reports it at debug.
      if (this.ctx.cancellationSignal.aborted) throw err;
      const next = nextAttempt(info, err, Date.now());
      const reason = err instanceof Error ? err.message : String(err);
      // A provider's push-back (its limit, an overload, the fleet's pacing) ends an attempt to wait outside it:
      // a wait, not a failure, and not counted as one.
      if (next.retried && isBackPressure(err)) {
        const when =
          next.at === undefined
            ? ''
            : `; it goes on at ${next.at.toISOString()} (in ${formatDelay(next.inMs)})`;
        log.info(`${info.activityType} waits for its turn at the provider: ${reason}${when}`);
        throw err;
      }
      this.metrics.stepFailed(info.activityType, next.retried);
      const head = `${info.activityType} attempt ${info.attempt} failed: ${reason}`;
      if (next.retried && next.at === undefined) {
        log.warn(`${head}; retried as the step's retry policy says`, { error: err });
      } else if (next.retried) {
        log.warn(`${head}; next attempt at ${next.at.toISOString()} (in ${formatDelay(next.inMs)})`, {
          error: err,
          nextAttemptAt: next.at.toISOString(),
        });
      } else {
        log.error(`${head}; not retried (${next.why})`, { error: err });
      }
      throw err;
    }
  }
}
