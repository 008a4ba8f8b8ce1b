/**
 * The contract of the batch workflow: what a batch is (a manifest of document references in the blob store),
 * its options, the tally it keeps, and what it answers about its progress. Workflow-safe like src/contract.ts:
 * no Node builtins, no I/O; it is bundled into the workflow sandbox.
 */
import { ActivityFailure, ChildWorkflowFailure, TimeoutFailure, TimeoutType } from '@temporalio/common';
import { z } from 'zod';
import { DocumentIdSchema, modelStepResults, PipelineOptionsSchema, STEPS, TextRefSchema } from './contract';
import type { PipelineResult, StepName } from './contract';

/** Bumped whenever BatchInput changes shape; older inputs are refused with a message, never guessed at. */
export const BATCH_SCHEMA_VERSION = 1;

/** One document of a batch: who it is, which version of its text, and where it came from (for messages). */
export const BatchEntrySchema = z
  .object({
    documentId: DocumentIdSchema,
    textRef: TextRefSchema,
    title: z.string().min(1).max(300),
    source: z.string().max(4096),
  })
  .strict();
export type BatchEntry = z.infer<typeof BatchEntrySchema>;

/** Entries per page of a big batch's manifest: what a client holds at once, however big the batch. */
export const MANIFEST_PAGE_SIZE = 1_000;

/** A page of entries, as stored in the blob store. A batch of one page is its own manifest. */
export const ManifestPageSchema = z.object({ entries: z.array(BatchEntrySchema) }).strict();

/**
 * The manifest, as stored in the blob store: its reference is the batch's content, and so its identity. Up to a
 * page of entries, the entries themselves; above, the references of its pages in order, each of `pageSize`
 * entries but the last, so that neither the client nor a worker ever holds the whole list.
 */
export const BatchManifestSchema = z.union([
  ManifestPageSchema,
  z
    .object({
      pages: z.array(TextRefSchema).min(1),
      pageSize: z.number().int().min(1),
      total: z.number().int().min(0),
    })
    .strict(),
]);
export type BatchManifest = z.infer<typeof BatchManifestSchema>;

export const BatchOptionsSchema = z
  .object({
    /** Document runs open at once: the sliding window. */
    window: z.number().int().min(1).max(1000).default(16),
    /**
     * History events one run of the batch may reach before it drains its window and continues as new (Temporal
     * warns at 10,240 events and also suggests continuing by itself, which is heeded too).
     */
    historyBudget: z.number().int().min(50).max(40_000).default(4_000),
    /** Entries read from the manifest per activity call. */
    pageSize: z.number().int().min(1).max(1000).default(250),
    /** Process documents again as new runs even where this version completed before (`--rerun`). */
    rerun: z.boolean().default(false),
    /** Passed to every document's run, complete (defaults filled in), so each run takes its input as it is. */
    pipeline: PipelineOptionsSchema.default(() => PipelineOptionsSchema.parse({})),
  })
  .strict();
export type BatchOptions = z.output<typeof BatchOptionsSchema>;

const StepCountSchema = z.object({ done: z.number().int().min(0), failed: z.number().int().min(0) });

/** What the batch has seen end, summed; carried across continue-as-new. */
export const BatchTallySchema = z.object({
  /** Documents that ended published (or superseded) by a run of this batch, or by one it attached to. */
  done: z.number().int().min(0),
  failed: z.number().int().min(0),
  /** Of `done`: answered `superseded` (a newer run of the document had published first; nothing written). */
  superseded: z.number().int().min(0),
  /** Of `done`: finished before this batch asked (the same version had completed): nothing ran again. */
  doneEarlier: z.number().int().min(0),
  /** Documents whose run of this version was already under way (another submission's): waited on, not rerun. */
  attached: z.number().int().min(0),
  /** Runs of another version of a document that this batch ended to start the new version. */
  replaced: z.number().int().min(0),
  steps: z.object(
    Object.fromEntries(STEPS.map((s) => [s, StepCountSchema])) as Record<StepName, typeof StepCountSchema>,
  ),
  inputTokens: z.number().int().min(0),
  outputTokens: z.number().int().min(0),
  costUsd: z.number().min(0),
  /** Model answers reused from the memo rather than paid for again. */
  memoised: z.number().int().min(0),
});
export type BatchTally = z.infer<typeof BatchTallySchema>;

/** A document that failed, with why; the batch keeps the first MAX_LISTED_FAILURES and counts the rest. */
export const BatchFailureSchema = z.object({
  /** 1 for the batch's first failure, and so on: lets a follower print each failure once. */
  seq: z.number().int().min(1),
  source: z.string(),
  workflowId: z.string(),
  step: z.string().optional(),
  reason: z.string(),
});
export type BatchFailure = z.infer<typeof BatchFailureSchema>;
export const MAX_LISTED_FAILURES = 500;

/** What one run of the batch hands the next when it continues as new. */
export const BatchCarriedSchema = z.object({
  /** Entries before this index have ended (every one in a run that drained before continuing). */
  next: z.number().int().min(0),
  tally: BatchTallySchema,
  failures: z.array(BatchFailureSchema).max(MAX_LISTED_FAILURES),
  /** Runs of this batch so far (1 for the first). */
  runs: z.number().int().min(1),
});
export type BatchCarried = z.infer<typeof BatchCarriedSchema>;

export const BatchInputSchema = z
  .object({
    schemaVersion: z.literal(BATCH_SCHEMA_VERSION),
    manifestRef: TextRefSchema,
    total: z.number().int().min(0),
    options: BatchOptionsSchema.default(() => BatchOptionsSchema.parse({})),
    carried: BatchCarriedSchema.optional(),
  })
  .strict();
export type BatchInput = z.input<typeof BatchInputSchema>;

/** The batch's answer to the progress query, and its result. */
/** A document whose delivery waits for a verdict: its run, its source and the delivery's key. */
export interface HeldDocument {
  workflowId: string;
  source: string;
  heldKey: string;
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

export function emptyTally(): BatchTally {
  const steps = Object.fromEntries(STEPS.map((s) => [s, { done: 0, failed: 0 }])) as BatchTally['steps'];
  return {
    done: 0,
    failed: 0,
    superseded: 0,
    doneEarlier: 0,
    attached: 0,
    replaced: 0,
    steps,
    inputTokens: 0,
    outputTokens: 0,
    costUsd: 0,
    memoised: 0,
  };
}

/** What a finished document adds to the tally: every step done, its tokens, cost and memo reuse. */
export function tallyResult(tally: BatchTally, result: PipelineResult): void {
  tally.done++;
  if (result.publication.superseded === true) tally.superseded++;
  for (const step of STEPS) tally.steps[step].done++;
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
      const { activityType } = current;
      step = STEPS.find((s) => s === activityType) ?? step;
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
