import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';
import type { BatchProgress } from '../contract/batch';
import type { BudgetNotice, HeldNotice, PipelineProgress, ReviewNotice } from '../contract/plain';
import type { ReviewDecision, ReviewDraft, ReviewOutcome } from '../contract/review';

/** Live step states, for progress displays; answered from workflow memory, no history read needed. */
export const progressQuery = defineQuery<PipelineProgress>('progress');

/** The batch's progress: counts, tokens and cost, and the failures listed after the argument's seq. */
export const batchProgressQuery = defineQuery<BatchProgress, [number?]>('batchProgress');

/** A document's run tells its batch that its delivery is held, or goes on again. */
export const deliveryHeldSignal = defineSignal<[HeldNotice]>('deliveryHeld');

/**
 * A batch that attached to a run another submission started asks it to tell this batch too, as it tells its
 * parent, when its delivery is held or goes on, and when a step waits for its budget.
 */
export const noticesWantedSignal = defineSignal<[{ workflowId: string }]>('noticesWanted');

/** `npm run deliveries -- resolve` tells a held run to look at the ledger again now, not at its next timer. */
export const deliverySettledSignal = defineSignal('deliverySettled');

/** A document's run tells its batch that a model step waits for its budget to be raised, or goes on again. */
export const budgetWaitSignal = defineSignal<[BudgetNotice]>('budgetWait');

/** `npm run budget -- raise` tells a run waiting for its budget to try again now, not at its next timer. */
export const budgetRaisedSignal = defineSignal('budgetRaised');

/**
 * A reviewer's decision on a run that awaits review (src/contract/review.ts): validated before it is accepted, so a malformed
 * or late decision is refused with a reason and leaves no trace in the history. The first decision wins; the same
 * update ID sent again gets the first one's answer from the server.
 */
export const reviewUpdate = defineUpdate<ReviewOutcome, [ReviewDecision]>('review');

/** The draft a run awaits review on, and its decision once given; undefined for a run that has no review. */
export const reviewQuery = defineQuery<ReviewDraft | undefined>('review');

/** A document's run tells its batch that it awaits review, or no longer does. */
export const reviewWaitSignal = defineSignal<[ReviewNotice]>('reviewWait');
