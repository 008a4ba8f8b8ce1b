import {
  ActivityFailure,
  allHandlersFinished,
  ApplicationFailure,
  condition,
  continueAsNew,
  getExternalWorkflowHandle,
  patched,
  proxyActivities,
  proxyLocalActivities,
  setHandler,
  workflowInfo,
} from '@temporalio/workflow';
import type { ActivityOptions } from '@temporalio/workflow';
import type { PipelineActivities } from '../activities';
import type {
  JsonValue,
  PipelineContinuation,
  PipelineResult,
  PublishInput,
  PublishResult,
  StepResultsBeforePublish,
} from '../src/contract';
import type { SummarizeResult } from '../activities/summarize/schema';
import type { TagResult } from '../activities/tag/schema';
import { modelOf, publicationFields } from '../activities/steps';
import {
  budgetIdOf,
  FailureType,
  heldKeyOf,
  initialProgress,
  isCompletePipelineInput,
  modelStepResults,
  refuseOtherSchemaVersions,
  STEPS,
} from '../src/steps';
import type { CompletePipelineInput } from '../src/steps';
import { asRunsOwnCheck } from './checks';
import type { SignalDefinition } from '@temporalio/workflow';
import {
  budgetRaisedSignal,
  budgetWaitSignal,
  deliveryHeldSignal,
  deliverySettledSignal,
  noticesWantedSignal,
  progressQuery,
  reviewWaitSignal,
} from './queries';
import type { PipelineProgress, StepName } from '../src/steps';
import { reviewPublishes } from '../src/review';
import type { PublishedReview, ReviewOutcome } from '../src/review';
import { reviewDesk } from './review';

export { batch } from './batch';
export {
  batchProgressQuery,
  budgetRaisedSignal,
  deliverySettledSignal,
  noticesWantedSignal,
  progressQuery,
  reviewQuery,
  reviewUpdate,
  reviewWaitSignal,
} from './queries';

/**
 * Retries fit the fault. No attempt cap: a worker that crashes or stalls times its attempts out (heartbeat
 * timeout), and that must never fail a document, however often it happens. What bounds a step is its overall
 * budget (schedule-to-close, from the input) and, for provider errors, a count the activity keeps in the memo
 * (MAX_PROVIDER_ERRORS), past which it fails the step for good with the provider's last error.
 *
 * Model steps: a dead worker is noticed by the heartbeat timeout (the activity heartbeats every 2 s), a hung
 * call by the start-to-close timeout, which the input may raise for big documents. A 429's Retry-After
 * overrides the backoff through the failure's nextRetryDelay.
 */
const modelStepOptions: ActivityOptions = {
  startToCloseTimeout: '2 minutes',
  heartbeatTimeout: '10 seconds',
  retry: {
    initialInterval: '2 seconds',
    backoffCoefficient: 2,
    maximumInterval: '2 minutes',
    // A refused payload fails alike on every attempt; the SDK marks argument-decoding failures retryable.
    nonRetryableErrorTypes: [FailureType.PayloadRefused],
  },
};

/**
 * Publish: the target (or the ledger in front of a webhook) dedupes by key, so retrying is safe. A held delivery
 * is not retried by the server: the workflow waits for its verdict (publishUntilSettled).
 */
const publishOptions: ActivityOptions = {
  activityId: 'publish',
  startToCloseTimeout: '1 minute',
  heartbeatTimeout: '10 seconds',
  retry: {
    initialInterval: '5 seconds',
    backoffCoefficient: 2,
    maximumInterval: '10 minutes',
    // A refused payload fails alike on every attempt; the SDK marks argument-decoding failures retryable.
    nonRetryableErrorTypes: [FailureType.PayloadRefused, FailureType.DeliveryHeld],
  },
};

/** The worker checks the input (a local activity: no round trip to the server, no schemas built in the sandbox). */
const { checkPipelineInput } = proxyLocalActivities<PipelineActivities>({
  startToCloseTimeout: '10 seconds',
  retry: { nonRetryableErrorTypes: [FailureType.InvalidInput, FailureType.PayloadRefused] },
});

/**
 * Summarize, tag, publish one document. The event history is the checkpoint: after a crash, replay skips every
 * step whose completion is recorded, and only the unfinished step runs again, under the same idempotency key.
 * Each activity ID is the step name, so keys read `<runId>:summarize`, `<runId>:tag`, `<runId>:publish`.
 *
 * `continuation` is absent on a first run; a run whose delivery is held continues as new with it (see
 * publishUntilSettled), and the next run goes straight back to the held publish.
 */
export async function documentPipeline(
  rawInput: unknown,
  continuation: PipelineContinuation = {},
): Promise<PipelineResult> {
  refuseOtherSchemaVersions(rawInput);
  // A complete input (what our clients send) is taken as it is; anything else is checked, with defaults filled
  // in, by the worker.
  const input = isCompletePipelineInput(rawInput)
    ? rawInput
    : await asRunsOwnCheck(checkPipelineInput(rawInput));
  const { documentId, textRef, title, options } = input;

  const progress = initialProgress(documentId);
  setHandler(progressQuery, () => progress);
  const notices = new BatchNotices(progress, continuation.held?.watchers ?? []);
  const desk = reviewDesk(progress);
  const step = async <T>(name: StepName, run: () => Promise<T>): Promise<T> => {
    progress.steps[name] = 'running';
    try {
      const result = await run();
      progress.steps[name] = 'done';
      return result;
    } catch (err) {
      progress.steps[name] = 'failed';
      throw err;
    }
  };

  // The model timeout and the step budget are per document, so the proxies are made per run from the defaults.
  const budget = { scheduleToCloseTimeout: `${options.stepBudgetMinutes} minutes` } as const;
  const modelTimeout = { ...budget, startToCloseTimeout: `${options.modelTimeoutSeconds} seconds` } as const;
  const { summarize } = proxyActivities<PipelineActivities>({
    ...modelStepOptions,
    ...modelTimeout,
    activityId: 'summarize',
  });
  const { tag } = proxyActivities<PipelineActivities>({
    ...modelStepOptions,
    ...modelTimeout,
    activityId: 'tag',
  });
  const held = { input, notices, continuation };

  // Continued as new while its delivery was held: summarize and tag are done (their results came along), and the
  // run goes straight back to the held publish, under the key the first run sent it with.
  const carried = continuation.held;
  if (carried !== undefined) {
    for (const name of STEPS) if (name !== 'publish') progress.steps[name] = 'done';
    const { results } = carried;
    const publication = await step('publish', () =>
      publishUntilSettled(carried.publish, budget, progress, { ...held, results }),
    );
    return { documentId, title, ...results, publication };
  }

  // A budget is passed on only where the run has one, so the steps' inputs are what they always were without.
  const spending = input.budget === undefined ? {} : { budget: input.budget };
  const withinBudget = budgetWaiter(progress, notices);
  const summarizeStep = (): Promise<SummarizeResult> =>
    step('summarize', () =>
      withinBudget('summarize', () =>
        summarize({ documentId, textRef, maxSentences: options.maxSummarySentences, ...spending }),
      ),
    );
  const tagStep = (): Promise<TagResult> =>
    step('tag', () =>
      withinBudget('tag', () => tag({ documentId, textRef, maxTags: options.maxTags, ...spending })),
    );

  // Summarize and tag are independent model calls, so they run side by side. In histories written before this
  // change tag is scheduled only after summarize completed: `patched` is false when such a run is replayed, and it
  // keeps the sequential path. `npm run check-replay` says when that path may go (docs/deploy.md): once no open or
  // retained run needs it (queries replay closed runs too), replace `patched` with
  // `deprecatePatch('parallel-model-steps')` and delete the else branch; drop deprecatePatch itself once no run
  // recorded with `patched` is left either.
  let summary: SummarizeResult;
  let tags: TagResult;
  if (patched('parallel-model-steps')) {
    [summary, tags] = await Promise.all([summarizeStep(), tagStep()]);
  } else {
    summary = await summarizeStep();
    tags = await tagStep();
  }
  // The steps' results so far, as the run's result holds them: a held run that continues as new carries them.
  const results = { summary, tags };
  // scheduledAt orders this run's publication against other runs of the document, so that a late publication of
  // an older run never overwrites a newer one (docs/recovery.md): workflow time is deterministic (the current
  // workflow task's start), fixed in the step's input for all its retries, and later in every later run. Not
  // workflowInfo().runStartTime: a reset to any but the first workflow task keeps the old run's first task, so
  // the reset run would report the same start time as the run it replaces.
  // What each step contributes to the publication (activities/steps.ts), and the model that made it.
  const drafted = { ...publicationFields(results) };
  const model = modelOf(results);
  // A run with a review waits here for a person (or the deadline): an edit is what is published, a rejection ends
  // the run with nothing published.
  let review: ReviewOutcome | undefined;
  if (input.review !== undefined) {
    const draft = { documentId, title, textRef, fields: drafted, model, costUsd: costOf(results) };
    review = await desk.await(draft, input.review, (awaiting) =>
      notices.tell(reviewWaitSignal, { workflowId: workflowInfo().workflowId, awaiting }),
    );
    if (!reviewPublishes(review)) return { documentId, title, ...results, review };
  }
  const publishInput = {
    documentId,
    title,
    textRef,
    ...drafted,
    ...review?.edits,
    ...(review === undefined ? {} : { review: publishedReview(review) }),
    model,
    scheduledAt: Date.now(),
  };
  // A held delivery (it may have landed unanswered: a person, or the receiver's lookup, must say) is a state of
  // the run, shown by its progress and its batch, not a retry that the step budget ends: the run waits for the
  // verdict as long as it takes, then looks again.
  const publication = await step('publish', () =>
    publishUntilSettled(publishInput, budget, progress, { ...held, results }),
  );
  return { documentId, title, ...results, publication, ...(review === undefined ? {} : { review }) };
}

/** What the draft's model calls cost in US dollars; null when a model had no price. */
function costOf(results: StepResultsBeforePublish): number | null {
  let total = 0;
  for (const answer of modelStepResults(results as PipelineResult)) {
    if (answer.estimatedCostUsd === null || answer.estimatedCostUsd === undefined) return null;
    total += answer.estimatedCostUsd;
  }
  return total;
}

/** What the publication records of its review: whether and by whom it was reviewed, and when. */
function publishedReview(review: ReviewOutcome): PublishedReview & Record<string, JsonValue> {
  const outcome = review.outcome === 'rejected' ? 'approved' : review.outcome;
  return {
    outcome,
    ...(review.reviewer === undefined ? {} : { reviewer: review.reviewer }),
    decidedAt: review.decidedAt,
  };
}

/** How long a step waiting for its budget waits before it looks again by itself (raising it wakes it at once). */
const BUDGET_FIRST_WAIT_MS = 60_000;
const BUDGET_MAX_WAIT_MS = 30 * 60_000;

/**
 * Runs a model step, pausing while its next call would pass the run's budget: the step fails at once with
 * BudgetExhausted (nothing was paid past the budget), the run shows the step waiting for budget and tells its
 * batch, then waits for `npm run budget -- raise` (budgetRaisedSignal) or its timer, and runs the step again under
 * the same activity ID, so the same key: answers already paid for come from the memo.
 */
function budgetWaiter(progress: PipelineProgress, notices: BatchNotices) {
  let raised = 0;
  setHandler(budgetRaisedSignal, () => void raised++);
  const waiting = new Set<StepName>();
  const tell = (budgetId: string | undefined): Promise<void> =>
    notices.tell(budgetWaitSignal, { workflowId: workflowInfo().workflowId, budgetId });
  return async <T>(name: StepName, run: () => Promise<T>): Promise<T> => {
    for (let waitMs = BUDGET_FIRST_WAIT_MS; ; waitMs = Math.min(waitMs * 2, BUDGET_MAX_WAIT_MS)) {
      try {
        const result = await run();
        if (waiting.delete(name) && waiting.size === 0) {
          delete progress.budgetId;
          await tell(undefined);
        }
        return result;
      } catch (err) {
        const overBudget = stepFailedWith(err, FailureType.BudgetExhausted);
        if (overBudget === undefined) throw err;
        const budgetId = budgetIdOf(overBudget.details) ?? 'unknown';
        waiting.add(name);
        if (progress.budgetId !== budgetId) {
          progress.budgetId = budgetId;
          await tell(budgetId);
        }
        progress.steps[name] = 'budget';
        const seen = raised;
        await condition(() => raised > seen, waitMs);
        progress.steps[name] = 'running';
      }
    }
  };
}

/** The first wait of a held delivery before it is looked at again; it doubles up to HELD_MAX_WAIT. */
const HELD_FIRST_WAIT_MS = 30_000;
const HELD_MAX_WAIT_MS = 5 * 60_000;

/**
 * History events a held run may reach before it continues as new (PipelineContinuation.historyBudget overrides it
 * for tests). A look costs 11-12 events, so Temporal's hard limit (51,200) would end a run after ~4,300 looks: ~16
 * days unattended, or as many settle signals. 2,000 is ~170 looks (~14 hours at the 5-minute wait), a fifth of
 * the 10,240 events at which Temporal starts warning, and small enough that a query on a held run (which replays
 * its history on a worker that no longer caches it) stays cheap; continuing costs one event and one look.
 * Temporal's own suggestion (continueAsNewSuggested) is heeded too.
 */
const HELD_HISTORY_BUDGET = 2_000;

/** What the held wait needs to continue the run as new: the run's input and what it carries over. */
interface HeldContext {
  input: CompletePipelineInput;
  notices: BatchNotices;
  continuation: PipelineContinuation;
  results: StepResultsBeforePublish;
}

/**
 * Publishes, waiting out a held delivery: the step fails at once on DeliveryHeld (not retried by the server), the
 * run shows it held, tells its batch, and waits (a timer, or `npm run deliveries -- resolve` waking it), then
 * publishes again under the same activity ID, so the same key. Nothing but the verdict ends the wait.
 *
 * A wait may outlast any history: before the run's history grows long (HELD_HISTORY_BUDGET), it continues as new
 * straight into this wait, carrying the publish input (so summarize and tag never run again) and the first run's
 * ID, so the delivery keeps its key (activities/idempotency.ts). Signal handlers are let finish first; a settle
 * signal that reached the old run too late to wake it costs nothing, since the new run looks at once.
 */
async function publishUntilSettled(
  input: PublishInput,
  budget: Pick<ActivityOptions, 'scheduleToCloseTimeout'>,
  progress: PipelineProgress,
  context: HeldContext,
): Promise<PublishResult> {
  const { publish } = proxyActivities<PipelineActivities>({ ...publishOptions, ...budget });
  let woken = false;
  setHandler(deliverySettledSignal, () => void (woken = true));
  const tell = (heldKey: string | undefined): Promise<void> =>
    context.notices.tell(deliveryHeldSignal, { workflowId: workflowInfo().workflowId, heldKey });

  /** Looks (publishes again) and waits until the verdict, continuing as new before the history grows long. */
  const waitOut = async (waitFrom: number, lookFirst: boolean): Promise<PublishResult> => {
    const publishInput = { ...input, keyRunId: input.keyRunId ?? workflowInfo().runId };
    let waitMs = waitFrom;
    for (let look = lookFirst; ; look = true) {
      if (look) {
        // A signal that arrives while the look is under way may be about a verdict the look missed: it counts.
        woken = false;
        try {
          const result = await publish(publishInput);
          await tell(undefined);
          return result;
        } catch (err) {
          const heldKey = heldKeyOfFailure(err);
          if (heldKey === undefined) throw err;
          if (progress.heldKey !== heldKey) {
            progress.heldKey = heldKey;
            await tell(heldKey);
          }
          waitMs = Math.min(waitMs * 2, HELD_MAX_WAIT_MS);
        }
      }
      await condition(() => woken, waitMs);
      if (historyNearLimit(context.continuation.historyBudget ?? HELD_HISTORY_BUDGET)) {
        // Handlers under way (telling a batch that just attached) finish in this run; signals that arrive after
        // this are the next run's.
        await condition(allHandlersFinished);
        const { historyBudget } = context.continuation;
        return continueAsNew<typeof documentPipeline>(context.input, {
          ...(historyBudget === undefined ? {} : { historyBudget }),
          held: {
            publish: publishInput,
            results: context.results,
            heldKey: progress.heldKey ?? 'unknown',
            waitMs,
            watchers: context.notices.watching(),
          },
        });
      }
    }
  };

  const carried = context.continuation.held;
  if (carried !== undefined) {
    // The run before this one was held: it shows so, and looks at once (a verdict may have come meanwhile).
    progress.heldKey = carried.heldKey;
    progress.steps.publish = 'held';
    return waitOut(carried.waitMs, true);
  }
  for (let waitMs = HELD_FIRST_WAIT_MS; ; waitMs = Math.min(waitMs * 2, HELD_MAX_WAIT_MS)) {
    try {
      const result = await publish(input);
      if (progress.heldKey !== undefined) await tell(undefined);
      return result;
    } catch (err) {
      const held = stepFailedWith(err, FailureType.DeliveryHeld);
      if (held === undefined) throw err;
      const heldKey = heldKeyOf(held.details) ?? 'unknown';
      if (progress.heldKey !== heldKey) {
        progress.heldKey = heldKey;
        await tell(heldKey);
      }
      progress.steps.publish = 'held';
      // Runs held before the wait could continue as new keep waiting as they did (their histories replay this
      // branch): no marker, `patched` false. Once `npm run check-replay` finds no open or retained run without the
      // marker, make it `deprecatePatch('held-continue-as-new')` and delete the lines after this `if`.
      if (patched('held-continue-as-new')) return waitOut(waitMs, false);
      woken = false;
      await condition(() => woken, waitMs);
      progress.steps.publish = 'running';
    }
  }
}

/** True once the run's history is `budget` events long, or Temporal suggests continuing as new. */
function historyNearLimit(budget: number): boolean {
  const info = workflowInfo();
  return info.continueAsNewSuggested || info.historyLength >= budget;
}

/** The key a DeliveryHeld failure of the step names, undefined for any other failure. */
function heldKeyOfFailure(err: unknown): string | undefined {
  const held = stepFailedWith(err, FailureType.DeliveryHeld);
  return held === undefined ? undefined : (heldKeyOf(held.details) ?? 'unknown');
}

/**
 * The step's own failure when it failed with `type`: a state the run waits out (a held delivery, a budget to
 * raise) rather than a failure of the run.
 */
function stepFailedWith(err: unknown, type: string): ApplicationFailure | undefined {
  return err instanceof ActivityFailure && err.cause instanceof ApplicationFailure && err.cause.type === type
    ? err.cause
    : undefined;
}

/**
 * Tells the run's batches how it stands: its parent, and batches that attached to it while it was under way
 * (noticesWantedSignal). A batch may have ended or continued meanwhile: telling it is a courtesy, never a reason
 * to fail.
 */
class BatchNotices {
  private readonly watchers: Set<string>;

  constructor(progress: PipelineProgress, watchers: readonly string[]) {
    this.watchers = new Set(watchers);
    setHandler(noticesWantedSignal, async ({ workflowId }) => {
      if (workflowId === workflowInfo().parent?.workflowId) return;
      this.watchers.add(workflowId);
      // The batch attached after this run told its own: it hears how the run stands now.
      const self = workflowInfo().workflowId;
      if (progress.heldKey !== undefined && progress.steps.publish === 'held')
        await signalBatch(workflowId, deliveryHeldSignal, { workflowId: self, heldKey: progress.heldKey });
      if (progress.budgetId !== undefined)
        await signalBatch(workflowId, budgetWaitSignal, { workflowId: self, budgetId: progress.budgetId });
    });
  }

  /** The batches that attached, to carry across continue-as-new. */
  watching(): string[] {
    return [...this.watchers];
  }

  async tell<A>(signal: SignalDefinition<[A]>, notice: A): Promise<void> {
    const parent = workflowInfo().parent;
    const batches = [...(parent === undefined ? [] : [parent.workflowId]), ...this.watchers];
    await Promise.all(batches.map((workflowId) => signalBatch(workflowId, signal, notice)));
  }
}

async function signalBatch<A>(workflowId: string, signal: SignalDefinition<[A]>, notice: A): Promise<void> {
  await getExternalWorkflowHandle(workflowId)
    .signal(signal, notice)
    .catch(() => undefined);
}
