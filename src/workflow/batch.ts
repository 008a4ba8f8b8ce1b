import {
  condition,
  continueAsNew,
  getExternalWorkflowHandle,
  patched,
  startChild,
  proxyActivities,
  proxyLocalActivities,
  setHandler,
  workflowInfo,
} from '@temporalio/workflow';
import { ApplicationFailure, WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import type { WorkflowIdReusePolicy } from '@temporalio/common';
import type { KitActivities } from '../steps/activities';
import type {
  BatchEntry,
  BatchFailure,
  BatchProgress,
  BudgetWaitingDocument,
  HeldDocument,
  ReviewWaitingDocument,
} from '../contract/batch';
import {
  countStep,
  describeFailure,
  emptyTally,
  MAX_LISTED_FAILURES,
  OPEN_LISTED,
  tallyResult,
} from '../contract/batch-plain';
import type { PipelineInput, PipelineResult } from '../contract';
import { FailureType, INPUT_SCHEMA_VERSION, workflowIdFor } from '../contract/plain';
import type { StepName } from '../contract/plain';
import { newBulkProgress, runBulkPhase } from './bulk';
import { asRunsOwnCheck } from './checks';
import {
  batchProgressQuery,
  budgetWaitSignal,
  deliveryHeldSignal,
  noticesWantedSignal,
  reviewWaitSignal,
} from './queries';

const { readBatchEntries, inspectRun } = proxyActivities<KitActivities>({
  startToCloseTimeout: '1 minute',
  retry: { initialInterval: '1 second', maximumInterval: '1 minute' },
});
/** Waiting on another submission's run lasts as long as that run; the heartbeat notices a dead worker. */
const { awaitRun } = proxyActivities<KitActivities>({
  startToCloseTimeout: '7 days',
  heartbeatTimeout: '30 seconds',
  retry: { initialInterval: '1 second', maximumInterval: '1 minute' },
});

/** The worker checks the input, as for a document's run (workflows/index.ts): no schemas built in the sandbox. */
const { checkBatchInput } = proxyLocalActivities<KitActivities>({
  startToCloseTimeout: '10 seconds',
  retry: { nonRetryableErrorTypes: [FailureType.InvalidInput, FailureType.PayloadRefused] },
});

/** How many times a document is looked at again when other submissions keep changing its runs meanwhile. */
const ROUNDS = 3;

/**
 * Runs every document of a batch through `documentPipeline`, each as a child run under the document's own
 * workflow ID, at most `window` at a time. The batch holds references only: the manifest (the entries, with
 * their text references) stays in the blob store and is read a page at a time. Before its history nears
 * Temporal's limits it stops starting documents, lets the window drain, and continues as new with its tally:
 * children do not carry over to the next run, so none is in flight at the boundary, and the next run starts at
 * the first entry not yet handed out. Nothing is lost or started twice across it.
 *
 * A document whose workflow ID is taken is decided as every submission decides (inspectRun): finished with this
 * version (counted, not rerun), under way with it (waited on), or another version's (replaced). Children are
 * ABANDONed when the batch closes: a document's run is its own checkpoint and outlives the batch that started it.
 */
export async function batch(rawInput: unknown): Promise<BatchProgress> {
  const input = await asRunsOwnCheck(checkBatchInput(rawInput));
  const { manifestRef, total, options } = input;
  const carried = input.carried ?? { next: 0, tally: emptyTally(), failures: [], runs: 1 };
  const { tally, failures } = carried;
  let next = carried.next;
  let running = 0;
  const open = new Set<string>();
  // The open runs' sources, and those whose delivery is held (each run says so: deliveryHeldSignal).
  const sources = new Map<string, string>();
  const held = new Map<string, HeldDocument>();
  setHandler(deliveryHeldSignal, ({ workflowId, heldKey }) => {
    const source = sources.get(workflowId);
    if (heldKey === undefined || source === undefined) held.delete(workflowId);
    else held.set(workflowId, { workflowId, source, heldKey });
  });
  // Those whose model step waits for its budget to be raised (each run says so: budgetWaitSignal).
  const overBudget = new Map<string, BudgetWaitingDocument>();
  setHandler(budgetWaitSignal, ({ workflowId, budgetId }) => {
    const source = sources.get(workflowId);
    if (budgetId === undefined || source === undefined) overBudget.delete(workflowId);
    else overBudget.set(workflowId, { workflowId, source, budgetId });
  });

  // Those whose draft awaits a person's review (each run says so: reviewWaitSignal).
  const inReview = new Map<string, ReviewWaitingDocument>();
  setHandler(reviewWaitSignal, ({ workflowId, awaiting }) => {
    const source = sources.get(workflowId);
    if (!awaiting || source === undefined) inReview.delete(workflowId);
    else inReview.set(workflowId, { workflowId, source });
  });

  // Bulk mode's provider batches (BULK=on), carried across continue-as-new.
  const bulk = options.bulk === undefined ? undefined : (carried.bulk ?? newBulkProgress());
  const progress = (since = 0): BatchProgress => ({
    total,
    started: next,
    running,
    tally,
    failures: failures.filter((f) => f.seq > since),
    unlistedFailures: tally.failed - failures.length,
    runs: carried.runs,
    open: [...open].slice(0, OPEN_LISTED),
    held: [...held.values()],
    waitingForBudget: [...overBudget.values()],
    awaitingReview: [...inReview.values()],
    handled,
    ...(bulk === undefined ? {} : { bulk }),
  });
  setHandler(batchProgressQuery, progress);

  const fail = (entry: BatchEntry, workflowId: string, why: { reason: string; step?: StepName }): void => {
    tally.failed++;
    if (why.step !== undefined) countStep(tally, why.step, 'failed');
    if (failures.length < MAX_LISTED_FAILURES) {
      const failure: BatchFailure = {
        seq: tally.failed,
        source: entry.source,
        workflowId,
        reason: why.reason,
      };
      failures.push(why.step === undefined ? failure : { ...failure, step: why.step });
    }
  };

  // For small batches, how each document was taken up, in the order it happened: a follower prints one line each.
  const handled: BatchProgress['handled'] = [];
  const note = (index: number, workflowId: string, how: BatchProgress['handled'][number]['how']): void => {
    if (total <= OPEN_LISTED) handled.push({ index, workflowId, how, at: Date.now() });
  };

  const runDocument = async (entry: BatchEntry, index: number): Promise<void> => {
    const workflowId = workflowIdFor(entry.documentId);
    const pipelineInput: PipelineInput = {
      schemaVersion: INPUT_SCHEMA_VERSION,
      documentId: entry.documentId,
      textRef: entry.textRef,
      title: entry.title,
      options: options.pipeline,
      // The batch's budget is shared by its runs; a batch without one sends none, as before budgets.
      ...(options.budget === undefined ? {} : { budget: options.budget }),
      ...(options.review === undefined ? {} : { review: options.review }),
    };
    let reuse: WorkflowIdReusePolicy = options.rerun ? 'ALLOW_DUPLICATE' : 'ALLOW_DUPLICATE_FAILED_ONLY';
    let replaced = false;
    open.add(workflowId);
    sources.set(workflowId, entry.source);
    try {
      for (let round = 0; round < ROUNDS; round++) {
        let child;
        try {
          child = await startChild<(input: PipelineInput) => Promise<PipelineResult>>('documentPipeline', {
            workflowId,
            args: [pipelineInput],
            memo: { version: entry.textRef, submission: workflowInfo().workflowId },
            workflowIdReusePolicy: reuse,
            parentClosePolicy: 'ABANDON',
          });
        } catch (err) {
          if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
          const verdict = await inspectRun({ workflowId, version: entry.textRef, rerun: options.rerun });
          if (verdict.kind === 'completed') {
            note(index, workflowId, 'done earlier');
            tally.done++;
            tally.doneEarlier++;
            return;
          }
          if (verdict.kind === 'running') {
            note(index, workflowId, 'attached');
            tally.attached++;
            // The run tells its own batch when its delivery is held or a step waits for budget; asked, it tells
            // this one too, so this batch lists it held rather than waiting on it without a word. Batches recorded
            // before the signal existed replay without it (`patched` false); `npm run check-replay` says when the
            // check may go (make it deprecatePatch, as for workflows/index.ts).
            if (patched('attached-run-notices')) {
              await getExternalWorkflowHandle(workflowId)
                .signal(noticesWantedSignal, { workflowId: workflowInfo().workflowId })
                .catch(() => undefined);
            }
            const awaited = await awaitRun({ workflowId, runId: verdict.runId });
            if (awaited.ok) tallyResult(tally, awaited.result);
            else fail(entry, workflowId, awaited);
            return;
          }
          replaced ||= verdict.replaced;
          reuse = verdict.reuse;
          continue;
        }
        note(index, workflowId, replaced ? 'replaced' : 'started');
        if (replaced) tally.replaced++;
        tallyResult(tally, await child.result());
        return;
      }
      fail(entry, workflowId, {
        reason:
          `${workflowId} kept changing while the batch started it (other versions of the document are being ` +
          'submitted at the same time); submit it again once they are done',
      });
    } catch (err) {
      fail(entry, workflowId, describeFailure(err));
    } finally {
      open.delete(workflowId);
      sources.delete(workflowId);
      held.delete(workflowId);
      overBudget.delete(workflowId);
      inReview.delete(workflowId);
    }
  };

  // The manifest, a page at a time: only the page under way is held.
  let page: BatchEntry[] = [];
  let pageStart = 0;
  const entryAt = async (index: number): Promise<BatchEntry> => {
    if (index < pageStart || index >= pageStart + page.length) {
      page = await readBatchEntries({ manifestRef, offset: index, limit: options.pageSize });
      pageStart = index;
    }
    const entry = page[index - pageStart];
    if (entry === undefined) {
      throw ApplicationFailure.create({
        type: FailureType.InvalidInput,
        nonRetryable: true,
        message: `batch manifest ${manifestRef} holds fewer than the ${total} entries the input says; submit again`,
      });
    }
    return entry;
  };
  const nearLimits = (): boolean => {
    const info = workflowInfo();
    return info.continueAsNewSuggested || info.historyLength >= options.historyBudget;
  };

  // Bulk mode: the model requests go to the provider's batch API before any document is handed out (once: a run
  // continued as new carries what it came to).
  if (options.bulk !== undefined && bulk !== undefined && bulk.phase !== 'done') {
    await runBulkPhase(
      {
        batchId: workflowInfo().workflowId,
        manifestRef,
        total,
        pipeline: options.pipeline,
        settings: options.bulk,
        budget: options.budget,
      },
      bulk,
    );
  }

  while (next < total) {
    await condition(() => running < options.window);
    if (nearLimits()) break;
    const entry = await entryAt(next);
    next++;
    running++;
    void runDocument(entry, next - 1).finally(() => running--);
  }
  await condition(() => running === 0);
  if (next < total) {
    await continueAsNew<typeof batch>({
      ...input,
      carried: { next, tally, failures, runs: carried.runs + 1, ...(bulk === undefined ? {} : { bulk }) },
    });
  }
  return progress();
}
