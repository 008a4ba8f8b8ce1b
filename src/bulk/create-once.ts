import { setTimeout as sleep } from 'node:timers/promises';
import { ApplicationFailure, log } from '@temporalio/activity';
import type { BulkClaim } from './claims';
import type { BulkApi, BulkLine, ProviderBatchState } from './types';

/** Creates tried within one attempt; past them the activity fails, and Temporal's retry goes on the same way. */
const CREATE_TRIES = 3;
/** The wait before each further try: a provider's listing may take a moment to show a batch just made. */
const TRY_AGAIN_MS = [1_000, 4_000];

/**
 * The provider batch of a claim that has none recorded, bought at most once. Neither provider's create takes an
 * idempotency key, so the create is sent once (the SDKs' own retries are off) and this is its retry: a create that
 * failed in a way that says nothing (a connection reset, a timeout, a gateway's 5xx: the provider may have made the
 * batch) is followed by a lookup at the provider (find, by the claim), and only a lookup that finds nothing lets
 * the create go again. A refusal of the request (a non-retryable failure: 400, 401, ...) fails at once.
 */
export async function findOrCreate(
  api: BulkApi,
  claim: BulkClaim,
  parts: { taken: () => Promise<ReadonlySet<string>>; lines: () => Promise<BulkLine[]> },
  signal: AbortSignal,
): Promise<{ state: ProviderBatchState; found: boolean }> {
  const customIds = new Set(claim.requests.map((r) => r.customId));
  let lines: BulkLine[] | undefined;
  for (let tries = 1; ; tries++) {
    const found = await api.find(
      claim.claimKey,
      { claimedAt: claim.claimedAt, customIds, taken: await parts.taken() },
      signal,
    );
    if (found !== undefined) return { state: found, found: true };
    lines ??= await parts.lines();
    try {
      return { state: await api.create(claim.claimKey, lines, signal), found: false };
    } catch (err) {
      const refused = err instanceof ApplicationFailure && err.nonRetryable;
      if (refused || signal.aborted || tries >= CREATE_TRIES) throw err;
      log.warn(
        'A provider batch create failed without saying whether the batch was made: looking for it first',
        {
          claimKey: claim.claimKey,
          error: err instanceof Error ? err.message : String(err),
        },
      );
      await sleep(TRY_AGAIN_MS[tries - 1] ?? 4_000, undefined, { signal });
    }
  }
}
