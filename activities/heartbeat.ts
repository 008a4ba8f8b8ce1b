import { Context } from '@temporalio/activity';

/** How often a running step heartbeats; well inside the workflow's heartbeat timeout. */
export const HEARTBEAT_EVERY_MS = 2_000;

/**
 * Runs the step's work while heartbeating, so a worker that dies mid-call is noticed after the heartbeat timeout
 * rather than the much longer start-to-close timeout. The work gets the activity's cancellation signal, which
 * fires when Temporal cancels or times out the attempt.
 */
export async function withHeartbeats<T>(work: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const context = Context.current();
  context.heartbeat();
  const timer = setInterval(() => context.heartbeat(), HEARTBEAT_EVERY_MS);
  try {
    return await work(context.cancellationSignal);
  } finally {
    clearInterval(timer);
  }
}
