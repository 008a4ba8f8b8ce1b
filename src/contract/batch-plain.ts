/**
 * The part of the batch's contract that the batch workflow reads on every run: its constants, what it answers
 * about its progress, its tally's arithmetic and how a failure is worded. Plain values and types, no schema
 * library, for the reason src/contract/plain.ts gives (every run evaluates the modules it imports afresh; the pipeline's
 * runs evaluate this one too, since workflows/index.ts exports the batch). The schemas live in
 * src/contract/batch.ts, which re-exports all of this.
 */
import { ActivityFailure, ChildWorkflowFailure, TimeoutFailure, TimeoutType } from '@temporalio/common';
import { modelStepResults, stepNameOfKey } from './plain';
import type { PipelineResult, StepName } from './plain';

/** Bumped whenever BatchInput changes shape; older inputs are refused with a message, never guessed at. */
export const BATCH_SCHEMA_VERSION = 1;

/** The batch keeps the first MAX_LISTED_FAILURES failures and counts the rest. */
export const MAX_LISTED_FAILURES = 500;

/** The batch's answer to the progress query, and its result. */
/** A document whose delivery waits for a verdict: its run, its source and the delivery's key. */
export interface HeldDocument {
  workflowId: string;
  source: string;
  heldKey: string;
}

/** A document whose model step waits for its budget to be raised: its run, its source and the budget. */
export interface BudgetWaitingDocument {
  workflowId: string;
  source: string;
  budgetId: string;
}

/** A document whose draft awaits a person's review: its run and its source. */
export interface ReviewWaitingDocument {
  workflowId: string;
  source: string;
}

export interface BatchProgress {
  total: number;
  /** Entries handed to a run (started or attached) so far. */
  started: number;
  running: number;
  tally: BatchTally;
  /** Listed failures with seq above the query's argument. */
  failures: BatchFailure[];
  /** Failures counted beyond the listed ones. */
  unlistedFailures: number;
  /** Runs of the batch so far (continue-as-new starts the next). */
  runs: number;
  /** Workflow IDs of the document runs in the window (up to OPEN_LISTED), for a follower's per-document lines. */
  open: string[];
  /**
   * The runs in the window whose delivery is held for a verdict (npm run deliveries): they end once it is given.
   * Optional: batches started before held deliveries were told to them do not have it.
   */
  held?: HeldDocument[];
  /**
   * The runs in the window waiting for their budget to be raised (npm run budget): they go on once it is.
   * Optional: batches started before budgets do not have it.
   */
  waitingForBudget?: BudgetWaitingDocument[];
  /** The runs in the window whose draft awaits review (npm run review). Optional: older batches lack it. */
  awaitingReview?: ReviewWaitingDocument[];
  /** Bulk mode (BULK=on): the provider batches that answer the model steps before the documents run. */
  bulk?: BulkProgress;
  /**
   * Small batches (up to OPEN_LISTED documents) only: how each document was taken up, by its manifest index:
   * started, started after ending the run of another version (replaced), found done earlier, or found under way
   * (attached).
   */
  handled: {
    index: number;
    workflowId: string;
    how: 'started' | 'replaced' | 'done earlier' | 'attached';
    /** Workflow time (epoch ms) it was taken up. */
    at: number;
  }[];
}
export const OPEN_LISTED = 20;

/** One provider batch of bulk mode, as the batch's progress shows it. */
export interface BulkBatchView {
  round: number;
  claimKey: string;
  providerBatchId: string;
  /** The provider's word for its state (`in_progress`, `completed`, `ended`, ...). */
  status: string;
  ended: boolean;
  total: number;
  succeeded: number;
  errored: number;
  pending: number;
}

/** What bulk mode's provider batches came to, summed over the batch's rounds (see BulkCollected). */
export interface BulkTotals {
  answered: number;
  refused: number;
  errored: number;
  expired: number;
  canceled: number;
  inputTokens: number;
  outputTokens: number;
  /** At the batch price; null when the model has no price. */
  costUsd: number | null;
  /** What the same answers would cost one call each, at the list price. */
  listCostUsd: number | null;
}

/** Bulk mode's state in the batch: where it is, its provider batches, and what they came to. */
export interface BulkProgress {
  /** submitting, waiting (between polls), collecting, done, or cancelled. */
  phase: 'submitting' | 'waiting' | 'collecting' | 'done' | 'cancelled';
  round: number;
  batches: BulkBatchView[];
  /** Requests the memo had answered before the first round (not sent again). */
  answeredBefore: number;
  totals: BulkTotals;
  /** Workflow time (epoch ms) of the next look at the provider, while waiting. */
  nextPollAt?: number;
  /** The last round's requests left out of its provider batches for the budget (absent: none were). */
  cut?: BudgetCut & { round: number };
}

/**
 * Requests a bulk submission left out because the budget left did not cover their worst case, and their
 * documents: the next round, or after the last the documents' own steps, ask for them.
 */
export interface BudgetCut {
  requests: number;
  documents: number;
  budgetId: string;
}

export function emptyBulkTotals(): BulkTotals {
  return {
    answered: 0,
    refused: 0,
    errored: 0,
    expired: 0,
    canceled: 0,
    inputTokens: 0,
    outputTokens: 0,
    costUsd: 0,
    listCostUsd: 0,
  };
}

/** Adds one provider batch's collected outcome into the totals. */
export function addBulkTotals(totals: BulkTotals, more: BulkTotals): void {
  totals.answered += more.answered;
  totals.refused += more.refused;
  totals.errored += more.errored;
  totals.expired += more.expired;
  totals.canceled += more.canceled;
  totals.inputTokens += more.inputTokens;
  totals.outputTokens += more.outputTokens;
  totals.costUsd = totals.costUsd === null || more.costUsd === null ? null : totals.costUsd + more.costUsd;
  totals.listCostUsd =
    totals.listCostUsd === null || more.listCostUsd === null ? null : totals.listCostUsd + more.listCostUsd;
}

/** What the batch has seen end, summed (BatchTallySchema in ./batch.ts documents each count). */
export type BatchTally = {
  done: number;
  failed: number;
  superseded: number;
  rejected?: number | undefined;
  doneEarlier: number;
  attached: number;
  replaced: number;
  steps: Record<string, { done: number; failed: number }>;
  inputTokens: number;
  outputTokens: number;
  costUsd: number;
  memoised: number;
};

/** A document that failed, with why (BatchFailureSchema in ./batch.ts). */
export type BatchFailure = {
  seq: number;
  source: string;
  workflowId: string;
  step?: string | undefined;
  reason: string;
};

export function emptyTally(): BatchTally {
  return {
    done: 0,
    failed: 0,
    superseded: 0,
    doneEarlier: 0,
    attached: 0,
    replaced: 0,
    steps: {},
    inputTokens: 0,
    outputTokens: 0,
    costUsd: 0,
    memoised: 0,
  };
}

/** Counts one step of a document as done or failed. */
export function countStep(tally: BatchTally, step: StepName, outcome: 'done' | 'failed'): void {
  const count = (tally.steps[step] ??= { done: 0, failed: 0 });
  count[outcome]++;
}

/** What a finished document adds to the tally: each step it did, its tokens, cost and memo reuse. */
export function tallyResult(tally: BatchTally, result: PipelineResult): void {
  tally.done++;
  if (result.publication === undefined) tally.rejected = (tally.rejected ?? 0) + 1;
  if (result.publication?.superseded === true) tally.superseded++;
  for (const answer of modelStepResults(result))
    countStep(tally, stepNameOfKey(answer.idempotencyKey), 'done');
  if (result.publication !== undefined)
    countStep(tally, stepNameOfKey(result.publication.idempotencyKey), 'done');
  for (const answer of modelStepResults(result)) {
    tally.inputTokens += answer.usage.inputTokens + (answer.rejectedUsage?.inputTokens ?? 0);
    tally.outputTokens += answer.usage.outputTokens + (answer.rejectedUsage?.outputTokens ?? 0);
    tally.costUsd += answer.estimatedCostUsd ?? 0;
    if (answer.memoised) tally.memoised++;
  }
}

/**
 * The batch's workflow ID: from the manifest's content, so submitting the same documents again (same versions,
 * same order) attaches to the batch under way. A rerun is a new batch each time it is asked for.
 */
export function batchIdFor(manifestRef: string, rerunAt?: number): string {
  const id = `batch-${manifestRef.slice('sha256:'.length, 'sha256:'.length + 24)}`;
  return rerunAt === undefined ? id : `${id}-rerun-${rerunAt}`;
}

/** What `inspectRun` decided about the latest run under a document's workflow ID (see settleLatestRun). */
export type RunVerdict =
  /** This version completed before: nothing runs again. */
  | { kind: 'completed'; runId: string }
  /** A run of this version is under way: wait for it. */
  | { kind: 'running'; runId: string }
  /**
   * Nothing blocks a new run any more (another version ended, or was ended now as `replaced`): start one with
   * `reuse`, which still refuses to repeat this version if it completed meanwhile (unless rerunning).
   */
  | { kind: 'start'; replaced: boolean; reuse: 'ALLOW_DUPLICATE' | 'ALLOW_DUPLICATE_FAILED_ONLY' };

/**
 * Why a run failed, for one line: the failure chain is followed through its wrappers (WorkflowFailedError,
 * ChildWorkflowFailure, ActivityFailure) to the failure that says what happened, and no further: a step that
 * failed for good names its last error itself, and that error's own message was written while a retry was still
 * to come. A step whose budget ran out says so, with its last attempt's error. The step is the activity's, if one
 * failed.
 */
export function describeFailure(err: unknown): { reason: string; step: StepName | undefined } {
  let step: StepName | undefined;
  let current: unknown = err;
  while (isWrapper(current) && current.cause instanceof Error) {
    if (current instanceof ActivityFailure) {
      step = current.activityType ?? step;
    }
    current = current.cause;
  }
  if (current instanceof TimeoutFailure) {
    const last = current.cause instanceof Error ? `; the last attempt: ${current.cause.message}` : '';
    const budget =
      current.timeoutType === TimeoutType.SCHEDULE_TO_CLOSE
        ? "the step's budget (STEP_BUDGET_MINUTES) ran out"
        : current.message;
    return { reason: `${budget}${last}`, step };
  }
  return { reason: current instanceof Error ? current.message : String(current), step };
}

/** The failures that only say where another failed: the reason is in their cause. */
function isWrapper(err: unknown): err is Error {
  return (
    err instanceof ActivityFailure ||
    err instanceof ChildWorkflowFailure ||
    (err instanceof Error && err.name === 'WorkflowFailedError')
  );
}

/** What `awaitRun` reports of a run it waited on. */
export type AwaitedRun =
  { ok: true; result: PipelineResult } | { ok: false; reason: string; step: StepName | undefined };
