import { Context } from '@temporalio/activity';

/** How often a running step heartbeats; well inside the workflow's heartbeat timeout. */
export const HEARTBEAT_EVERY_MS = 2_000;

/**
 * Runs the step's work while heartbeating, so a worker that dies mid-call is noticed after the heartbeat timeout
 * rather than the much longer start-to-close timeout. The work gets the activity's cancellation signal, which
 * fires when Temporal cancels or times out the attempt.
 *
 * The first heartbeat comes after HEARTBEAT_EVERY_MS, not at once: the server's heartbeat timeout runs from the
 * attempt's start without one, and the SDK sends an attempt's first heartbeat straight to the server (it throttles
 * only the later ones), a request and a write of the server's for every step, most of which end long before.
 */
export async function withHeartbeats<T>(work: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const context = Context.current();
  const timer = setInterval(() => context.heartbeat(), HEARTBEAT_EVERY_MS);
  try {
    return await work(context.cancellationSignal);
  } finally {
    clearInterval(timer);
  }
}
