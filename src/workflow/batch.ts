import {
  condition,
  continueAsNew,
  getExternalWorkflowHandle,
  patched,
  startChild,
  proxyActivities,
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
import type { BatchCarried, BatchInput, CheckedBatchInput } from '../contract/batch';
import type { PipelineInput, PipelineResult } from '../contract';
import { DOCUMENT_WORKFLOW, FailureType, INPUT_SCHEMA_VERSION, workflowIdFor } from '../contract/plain';
import type { StepName } from '../contract/plain';
import { newBulkProgress, runBulkPhase } from './bulk';
import type { BulkProgress } from '../contract/batch-plain';
import { checkedBatchInput } from './checks';
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
  const input = await checkedBatchInput(rawInput);
  return new BatchRun(input).run();
}

/** A document of the batch, as its run is under way. */
interface Taken {
  entry: BatchEntry;
  index: number;
  workflowId: string;
}

/** One run of a batch: its tally, the documents under way and what they wait for, and the manifest's page. */
class BatchRun {
  private readonly tally: BatchCarried['tally'];
  private readonly failures: BatchFailure[];
  private next: number;
  private running = 0;
  private readonly open = new Set<string>();
  /** The open runs' sources; those whose delivery is held, whose step waits for budget, whose draft for review. */
  private readonly sources = new Map<string, string>();
  private readonly held = new Map<string, HeldDocument>();
  private readonly overBudget = new Map<string, BudgetWaitingDocument>();
  private readonly inReview = new Map<string, ReviewWaitingDocument>();
  /** Bulk mode's provider batches (BULK=on), carried across continue-as-new. */
  private readonly bulk: BulkProgress | undefined;
  /** For small batches, how each document was taken up, in order: a follower prints one line each. */
  private readonly handled: BatchProgress['handled'] = [];
  /** The manifest, a page at a time: only the page under way is held. */
  private page: BatchEntry[] = [];
  private pageStart = 0;

  constructor(
    private readonly input: CheckedBatchInput,
    private readonly carried = input.carried ?? { next: 0, tally: emptyTally(), failures: [], runs: 1 },
  ) {
    this.tally = carried.tally;
    this.failures = carried.failures;
    this.next = carried.next;
    this.bulk = input.options.bulk === undefined ? undefined : (carried.bulk ?? newBulkProgress());
    this.listen();
  }

  /** Each run says when its delivery is held, a step waits for budget, or its draft awaits review. */
  private listen(): void {
    const track = <T>(
      waiting: Map<string, T>,
      workflowId: string,
      value: (source: string) => T | undefined,
    ) => {
      const source = this.sources.get(workflowId);
      const now = source === undefined ? undefined : value(source);
      if (now === undefined) waiting.delete(workflowId);
      else waiting.set(workflowId, now);
    };
    setHandler(deliveryHeldSignal, ({ workflowId, heldKey }) =>
      track(this.held, workflowId, (source) =>
        heldKey === undefined ? undefined : { workflowId, source, heldKey },
      ),
    );
    setHandler(budgetWaitSignal, ({ workflowId, budgetId }) =>
      track(this.overBudget, workflowId, (source) =>
        budgetId === undefined ? undefined : { workflowId, source, budgetId },
      ),
    );
    setHandler(reviewWaitSignal, ({ workflowId, awaiting }) =>
      track(this.inReview, workflowId, (source) => (awaiting ? { workflowId, source } : undefined)),
    );
    setHandler(batchProgressQuery, (since) => this.progress(since));
  }

  progress(since = 0): BatchProgress {
    const { tally, failures, bulk } = this;
    return {
      total: this.input.total,
      started: this.next,
      running: this.running,
      tally,
      failures: failures.filter((f) => f.seq > since),
      unlistedFailures: tally.failed - failures.length,
      runs: this.carried.runs,
      open: [...this.open].slice(0, OPEN_LISTED),
      held: [...this.held.values()],
      waitingForBudget: [...this.overBudget.values()],
      awaitingReview: [...this.inReview.values()],
      handled: this.handled,
      ...(bulk === undefined ? {} : { bulk }),
    };
  }

  /** Hands out the documents, a window at a time, then drains; continues as new before the history grows long. */
  async run(): Promise<BatchProgress> {
    const { input, bulk } = this;
    const { options, total } = input;
    // Bulk mode: the model requests go to the provider's batch API before any document is handed out (once: a
    // run continued as new carries what it came to).
    if (options.bulk !== undefined && bulk !== undefined && bulk.phase !== 'done') {
      const batchId = workflowInfo().workflowId;
      const { manifestRef } = input;
      const { pipeline, bulk: settings, budget } = options;
      await runBulkPhase({ batchId, manifestRef, total, pipeline, settings, budget }, bulk);
    }
    // Drafts that wait for a person hold no slot of the window: a person may take days, and the documents after
    // them would wait as long without starting. Batches recorded before this replay with the old window.
    const holding = patched('reviews-free-window')
      ? () => this.running - this.inReview.size
      : () => this.running;
    while (this.next < total) {
      await condition(() => holding() < options.window);
      if (this.nearLimits()) break;
      const entry = await this.entryAt(this.next);
      const index = this.next++;
      this.running++;
      void this.take({ entry, index, workflowId: workflowIdFor(entry.documentId) }).finally(
        () => this.running--,
      );
    }
    await condition(() => this.running === 0);
    if (this.next < total) {
      const { tally, failures, next } = this;
      await continueAsNew<typeof batch>({
        ...input,
        carried: {
          next,
          tally,
          failures,
          runs: this.carried.runs + 1,
          ...(bulk === undefined ? {} : { bulk }),
        },
      } satisfies BatchInput);
    }
    return this.progress();
  }

  /** One document: its run started (or attached to), waited for and counted; a failure listed, never thrown. */
  private async take(doc: Taken): Promise<void> {
    const { workflowId } = doc;
    this.open.add(workflowId);
    this.sources.set(workflowId, doc.entry.source);
    try {
      await this.startOrAttach(doc);
    } catch (err) {
      this.fail(doc, describeFailure(err));
    } finally {
      for (const waiting of [this.open, this.sources, this.held, this.overBudget, this.inReview])
        waiting.delete(workflowId);
    }
  }

  /**
   * Starts the document's run as a child, or, when its workflow ID is taken, decides as every submission does
   * (inspectRun): done earlier with this version (counted), under way with it (attached), or another version's
   * (replaced, and started again).
   */
  private async startOrAttach(doc: Taken): Promise<void> {
    const { entry, index, workflowId } = doc;
    const { options } = this.input;
    let reuse: WorkflowIdReusePolicy = options.rerun ? 'ALLOW_DUPLICATE' : 'ALLOW_DUPLICATE_FAILED_ONLY';
    let replaced = false;
    for (let round = 0; round < ROUNDS; round++) {
      let child;
      try {
        child = await startChild<(input: PipelineInput) => Promise<PipelineResult>>(DOCUMENT_WORKFLOW, {
          workflowId,
          args: [this.pipelineInput(entry)],
          memo: { version: entry.textRef, submission: workflowInfo().workflowId },
          workflowIdReusePolicy: reuse,
          parentClosePolicy: 'ABANDON',
        });
      } catch (err) {
        if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
        const verdict = await inspectRun({ workflowId, version: entry.textRef, rerun: options.rerun });
        if (verdict.kind === 'completed') {
          this.note(index, workflowId, 'done earlier');
          this.tally.done++;
          this.tally.doneEarlier++;
          return;
        }
        if (verdict.kind === 'running') return this.attach(doc, verdict.runId);
        replaced ||= verdict.replaced;
        reuse = verdict.reuse;
        continue;
      }
      this.note(index, workflowId, replaced ? 'replaced' : 'started');
      if (replaced) this.tally.replaced++;
      tallyResult(this.tally, await child.result());
      return;
    }
    this.fail(doc, {
      reason:
        `${workflowId} kept changing while the batch started it (other versions of the document are being ` +
        'submitted at the same time); submit it again once they are done',
    });
  }

  /** Waits for a run of this version that another submission started, and counts how it ended. */
  private async attach(doc: Taken, runId: string): Promise<void> {
    const { index, workflowId } = doc;
    this.note(index, workflowId, 'attached');
    this.tally.attached++;
    // The run tells its own batch when its delivery is held or a step waits for budget; asked, it tells this one
    // too, so this batch lists it held rather than waiting on it without a word. Batches recorded before the
    // signal existed replay without it (`patched` false); `npm run check-replay` says when the check may go.
    if (patched('attached-run-notices')) {
      await getExternalWorkflowHandle(workflowId)
        .signal(noticesWantedSignal, { workflowId: workflowInfo().workflowId })
        .catch(() => undefined);
    }
    const awaited = await awaitRun({ workflowId, runId });
    if (awaited.ok) tallyResult(this.tally, awaited.result);
    else this.fail(doc, awaited);
  }

  /** A document's run input: the batch's options, budget and review. */
  private pipelineInput(entry: BatchEntry): PipelineInput {
    const { options } = this.input;
    return {
      schemaVersion: INPUT_SCHEMA_VERSION,
      documentId: entry.documentId,
      textRef: entry.textRef,
      title: entry.title,
      options: options.pipeline,
      // The batch's budget is shared by its runs; a batch without one sends none, as before budgets.
      ...(options.budget === undefined ? {} : { budget: options.budget }),
      ...(options.review === undefined ? {} : { review: options.review }),
      // Agent steps look into the batch's other documents: the manifest is their corpus.
      ...(options.agent === undefined
        ? {}
        : { agent: { ...options.agent, corpusRef: this.input.manifestRef } }),
    };
  }

  private fail({ entry, workflowId }: Taken, why: { reason: string; step?: StepName | undefined }): void {
    const { tally, failures } = this;
    tally.failed++;
    if (why.step !== undefined) countStep(tally, why.step, 'failed');
    if (failures.length >= MAX_LISTED_FAILURES) return;
    const failure: BatchFailure = { seq: tally.failed, source: entry.source, workflowId, reason: why.reason };
    failures.push(why.step === undefined ? failure : { ...failure, step: why.step });
  }

  private note(index: number, workflowId: string, how: BatchProgress['handled'][number]['how']): void {
    if (this.input.total <= OPEN_LISTED) this.handled.push({ index, workflowId, how, at: Date.now() });
  }

  private async entryAt(index: number): Promise<BatchEntry> {
    const { manifestRef, total, options } = this.input;
    if (index < this.pageStart || index >= this.pageStart + this.page.length) {
      this.page = await readBatchEntries({ manifestRef, offset: index, limit: options.pageSize });
      this.pageStart = index;
    }
    const entry = this.page[index - this.pageStart];
    if (entry !== undefined) return entry;
    throw ApplicationFailure.create({
      type: FailureType.InvalidInput,
      nonRetryable: true,
      message: `batch manifest ${manifestRef} holds fewer than the ${total} entries the input says; submit again`,
    });
  }

  private nearLimits(): boolean {
    const info = workflowInfo();
    return info.continueAsNewSuggested || info.historyLength >= this.input.options.historyBudget;
  }
}
