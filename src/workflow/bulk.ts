import { CancellationScope, isCancellation, proxyActivities, sleep } from '@temporalio/workflow';
import type { KitActivities } from '../steps/activities';
import type { BulkPart } from '../bulk/activities';
import { addBulkTotals, emptyBulkTotals } from '../contract/batch-plain';
import type { BulkBatchView, BulkProgress } from '../contract/batch-plain';
import type { BulkSettings } from '../contract/batch';
import type { PipelineOptions } from '../contract';
import type { BudgetRef } from '../model/rate-limit-store';

/** Submitting reads the manifest and uploads the requests; collecting reads the results into the memo. */
const { bulkSubmit, bulkCollect, bulkCancel } = proxyActivities<KitActivities>({
  startToCloseTimeout: '30 minutes',
  heartbeatTimeout: '10 seconds',
  retry: { initialInterval: '5 seconds', maximumInterval: '5 minutes' },
});
/** One look at a provider batch: a short call, tried again through the provider's outages. */
const { bulkPoll } = proxyActivities<KitActivities>({
  startToCloseTimeout: '2 minutes',
  heartbeatTimeout: '10 seconds',
  retry: { initialInterval: '5 seconds', maximumInterval: '5 minutes' },
});

/** Looks at a cancelled provider batch this many times (OpenAI takes up to 10 minutes to cancel) for its paid part. */
const CANCEL_LOOKS = 8;

export interface BulkPhaseInput {
  batchId: string;
  manifestRef: string;
  total: number;
  pipeline: PipelineOptions;
  settings: BulkSettings;
  /** The batch's budget: what its provider batches cost is charged to it, before the documents' own calls. */
  budget?: BudgetRef | undefined;
}

export function newBulkProgress(): BulkProgress {
  return { phase: 'submitting', round: 0, batches: [], answeredBefore: 0, totals: emptyBulkTotals() };
}

/**
 * Bulk mode, before the batch hands out its documents (docs/bulk.md): in each round, the requests the memo has
 * no answer for go to the provider's batch API (bulkSubmit: claimed before created, found again after a crash),
 * the workflow waits on its own timers, backing off from `pollSeconds` to `pollMaxSeconds` between looks, and
 * each ended provider batch's answers go into the memo (bulkCollect). A round's submission is cut to what the
 * batch's budget has left (at each request's worst case). What a round leaves unanswered or cut goes into the
 * next; after the last, each document's own step calls the model for what is still missing, within the budget.
 *
 * Cancelled (npm run bulk -- cancel, or the batch cancelled), it cancels the provider batches, waits a while for
 * them to end, and keeps what they answered before it stopped: those answers are paid.
 */
export async function runBulkPhase(input: BulkPhaseInput, progress: BulkProgress): Promise<void> {
  const { settings } = input;
  let live: BulkPart[] = [];
  try {
    for (let round = 1; round <= settings.rounds; round++) {
      progress.round = round;
      progress.phase = 'submitting';
      const submitted = await bulkSubmit({
        batchId: input.batchId,
        round,
        manifestRef: input.manifestRef,
        total: input.total,
        pipeline: input.pipeline,
        maxRequests: settings.maxRequests,
        ...(input.budget === undefined ? {} : { budget: input.budget }),
      });
      if (round === 1) progress.answeredBefore = submitted.answeredBefore;
      // Requests the budget left did not cover wait for the next round, when what was bought is known.
      const { cut } = submitted;
      if (cut === undefined) delete progress.cut;
      else progress.cut = { ...cut, round };
      live = submitted.parts;
      if (live.length === 0) break;
      show(progress, round, live);
      progress.phase = 'waiting';
      await waitForEnd(progress, round, live, settings);
      progress.phase = 'collecting';
      const unanswered = await collect(progress, live, input.budget);
      live = [];
      if (unanswered === 0 && cut === undefined) break;
    }
    progress.phase = 'done';
    delete progress.nextPollAt;
  } catch (err) {
    if (!isCancellation(err)) throw err;
    progress.phase = 'cancelled';
    delete progress.nextPollAt;
    await CancellationScope.nonCancellable(async () => {
      // Every provider batch not yet collected, those a submission cut short made included.
      live = await bulkCancel({ batchId: input.batchId });
      // What the provider answered before the cancel is paid: wait for the batches to end and keep it.
      for (let look = 0; look < CANCEL_LOOKS && live.some((p) => !p.state.ended); look++) {
        await sleep(settings.pollSeconds * 1000);
        await poll(progress, progress.round, live);
      }
      await collect(
        progress,
        live.filter((p) => p.state.ended),
        input.budget,
      );
    });
    throw err;
  }
}

/** Waits on the workflow's timers until every provider batch of the round has ended. */
async function waitForEnd(
  progress: BulkProgress,
  round: number,
  live: BulkPart[],
  settings: BulkSettings,
): Promise<void> {
  let delayS = settings.pollSeconds;
  while (live.some((p) => !p.state.ended)) {
    progress.nextPollAt = Date.now() + delayS * 1000;
    await sleep(delayS * 1000);
    delayS = Math.min(delayS * 2, settings.pollMaxSeconds);
    await poll(progress, round, live);
  }
  delete progress.nextPollAt;
}

async function poll(progress: BulkProgress, round: number, live: BulkPart[]): Promise<void> {
  for (const part of live) {
    if (part.state.ended) continue;
    part.state = await bulkPoll({ providerBatchId: part.providerBatchId });
  }
  show(progress, round, live);
}

/** Collects each ended provider batch into the memo; returns the requests left without an answer. */
async function collect(
  progress: BulkProgress,
  ended: BulkPart[],
  budget: BudgetRef | undefined,
): Promise<number> {
  let unanswered = 0;
  for (const part of ended) {
    const collected = await bulkCollect({
      claimKey: part.claimKey,
      ...(budget === undefined ? {} : { budget }),
    });
    addBulkTotals(progress.totals, collected);
    unanswered += collected.refused + collected.errored + collected.expired + collected.canceled;
  }
  return unanswered;
}

/** The round's provider batches in the progress, in place of what it showed of them before. */
function show(progress: BulkProgress, round: number, live: BulkPart[]): void {
  const views: BulkBatchView[] = live.map((p) => ({
    round,
    claimKey: p.claimKey,
    providerBatchId: p.providerBatchId,
    status: p.state.status,
    ended: p.state.ended,
    ...p.state.counts,
  }));
  progress.batches = [...progress.batches.filter((b) => b.round !== round), ...views];
}
