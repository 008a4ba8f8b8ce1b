import { ApplicationFailure } from '@temporalio/common';
import { FailureType } from '../contract';
import { excerpt, isRetryableStatus } from '../lib/http';

/**
 * A batch API call's failure as Temporal should see it. The SDKs retry connection failures, 408, 409, 429 and
 * 5xx themselves a few times (not a create, sent once: create-once.ts retries it after a lookup); what is left of
 * those is retried by Temporal (the activity fails retryably), while a refusal of the request (401, 403, 404, 400)
 * fails at once and says what to fix.
 */
export function bulkApiFailure(
  err: unknown,
  what: string,
  variables: { apiKey: string; baseUrl: string },
): unknown {
  const status = (err as { status?: unknown } | null)?.status;
  if (typeof status !== 'number' || isRetryableStatus(status) || status === 409) return err;
  const hint =
    status === 401 || status === 403
      ? `check ${variables.apiKey} (and that the key may use the batch API)`
      : status === 404
        ? `check ${variables.baseUrl}: it should be the provider's API (ending in /v1)`
        : 'check the request the server refuses';
  return ApplicationFailure.create({
    type: FailureType.ModelRejected,
    nonRetryable: true,
    message: `${what} answered HTTP ${status}: ${excerpt(err instanceof Error ? err.message : String(err))}; ${hint}`,
  });
}

/** Runs one batch API call, sorting its failure (bulkApiFailure). */
export async function sortedCall<T>(
  run: () => Promise<T>,
  what: string,
  variables: { apiKey: string; baseUrl: string },
): Promise<T> {
  try {
    return await run();
  } catch (err) {
    throw bulkApiFailure(err, what, variables);
  }
}
