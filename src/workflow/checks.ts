import { ActivityFailure, ApplicationFailure } from '@temporalio/workflow';

/**
 * A worker-side input check (a local activity) as the run's own: its ApplicationFailure fails the run as it is, not
 * wrapped in the ActivityFailure of the activity that made it, so the run says what to fix.
 */
export async function asRunsOwnCheck<T>(check: Promise<T>): Promise<T> {
  try {
    return await check;
  } catch (err) {
    if (err instanceof ActivityFailure && err.cause instanceof ApplicationFailure) throw err.cause;
    throw err;
  }
}
