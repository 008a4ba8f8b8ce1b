import {
  allHandlersFinished,
  condition,
  continueAsNew,
  patched,
  proxyActivities,
  setHandler,
  workflowInfo,
} from '@temporalio/workflow';
import type { ActivityOptions } from '@temporalio/workflow';
import type {
  PipelineContinuation,
  PublishInput,
  PublishResult,
  StepResultsBeforePublish,
} from '../contract';
import { FailureType, heldKeyOf, PUBLISH_STEP } from '../contract/plain';
import type { CompletePipelineInput, PipelineProgress } from '../contract/plain';
import type { BatchNotices } from './notices';
import { deliveryHeldSignal, deliverySettledSignal } from './queries';
import { stepFailedWith } from './waits';

/** A document workflow: what a held run continues as new into (the same workflow type, its input and carry-over). */
export type DocumentWorkflow = (rawInput: unknown, continuation?: PipelineContinuation) => Promise<unknown>;

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
export interface HeldContext {
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
 * straight into this wait, carrying the publish input (so the model steps never run again) and the first run's
 * ID, so the delivery keeps its key (src/steps/idempotency.ts). Signal handlers are let finish first; a settle
 * signal that reached the old run too late to wake it costs nothing, since the new run looks at once.
 */
export function publishUntilSettled(
  input: PublishInput,
  budget: Pick<ActivityOptions, 'scheduleToCloseTimeout'>,
  progress: PipelineProgress,
  context: HeldContext,
): Promise<PublishResult> {
  const delivery = new HeldDelivery(budget, progress, context);
  const carried = context.continuation.held;
  if (carried === undefined) return delivery.publish(input);
  // The run before this one was held: it shows so, and looks at once (a verdict may have come meanwhile).
  progress.heldKey = carried.heldKey;
  progress.steps[PUBLISH_STEP] = 'held';
  return delivery.waitOut(input, carried.waitMs, true);
}

/** One run's publish step and the wait for its held delivery's verdict. */
class HeldDelivery {
  private readonly activity: (input: PublishInput) => Promise<PublishResult>;
  private woken = false;

  constructor(
    budget: Pick<ActivityOptions, 'scheduleToCloseTimeout'>,
    private readonly progress: PipelineProgress,
    private readonly context: HeldContext,
  ) {
    const { publish } = proxyActivities<{ publish: (input: PublishInput) => Promise<PublishResult> }>({
      ...publishOptions,
      ...budget,
    });
    this.activity = publish;
    setHandler(deliverySettledSignal, () => void (this.woken = true));
  }

  /** Publishes; a held delivery is waited out (continuing as new while it waits, in runs with the marker). */
  async publish(input: PublishInput): Promise<PublishResult> {
    for (let waitMs = HELD_FIRST_WAIT_MS; ; waitMs = Math.min(waitMs * 2, HELD_MAX_WAIT_MS)) {
      const looked = await this.look(input);
      if (looked.result !== undefined) return looked.result;
      this.progress.steps[PUBLISH_STEP] = 'held';
      // Runs held before the wait could continue as new keep waiting as they did (their histories replay this
      // branch): no marker, `patched` false. Once `npm run check-replay` finds no open or retained run without
      // the marker, make it `deprecatePatch('held-continue-as-new')` and delete the lines after this `if`.
      if (patched('held-continue-as-new')) return this.waitOut(input, waitMs, false);
      this.woken = false;
      await condition(() => this.woken, waitMs);
      this.progress.steps[PUBLISH_STEP] = 'running';
    }
  }

  /** Looks (publishes again) and waits until the verdict, continuing as new before the history grows long. */
  async waitOut(input: PublishInput, waitFrom: number, lookFirst: boolean): Promise<PublishResult> {
    const publishInput = { ...input, keyRunId: input.keyRunId ?? workflowInfo().runId };
    let waitMs = waitFrom;
    for (let look = lookFirst; ; look = true) {
      if (look) {
        // A signal that arrives while the look is under way may be about a verdict the look missed: it counts.
        this.woken = false;
        const looked = await this.look(publishInput, true);
        if (looked.result !== undefined) return looked.result;
        waitMs = Math.min(waitMs * 2, HELD_MAX_WAIT_MS);
      }
      await condition(() => this.woken, waitMs);
      const { historyBudget } = this.context.continuation;
      if (historyNearLimit(historyBudget ?? HELD_HISTORY_BUDGET))
        return this.continueHeld(publishInput, waitMs);
    }
  }

  /**
   * One publish: its receipt, or the held delivery's key (shown in the progress, and told to the batch when it
   * is new). The batch hears the delivery go on when it had been told it was held (`always`: a continued run's).
   */
  private async look(input: PublishInput, always = false): Promise<{ result?: PublishResult }> {
    try {
      const result = await this.activity(input);
      if (always || this.progress.heldKey !== undefined) await this.tell(undefined);
      return { result };
    } catch (err) {
      const held = stepFailedWith(err, FailureType.DeliveryHeld);
      if (held === undefined) throw err;
      const heldKey = heldKeyOf(held.details) ?? 'unknown';
      if (this.progress.heldKey !== heldKey) {
        this.progress.heldKey = heldKey;
        await this.tell(heldKey);
      }
      return {};
    }
  }

  /** Continues the run as new straight into the wait, with what the next run needs to publish under this key. */
  private async continueHeld(publish: PublishInput & { keyRunId: string }, waitMs: number): Promise<never> {
    // Handlers under way (telling a batch that just attached) finish in this run; signals that arrive after this
    // are the next run's.
    await condition(allHandlersFinished);
    const { context, progress } = this;
    const { historyBudget } = context.continuation;
    return continueAsNew<DocumentWorkflow>(context.input, {
      ...(historyBudget === undefined ? {} : { historyBudget }),
      held: {
        publish,
        results: context.results,
        heldKey: progress.heldKey ?? 'unknown',
        waitMs,
        watchers: context.notices.watching(),
      },
    });
  }

  private tell(heldKey: string | undefined): Promise<void> {
    const { workflowId } = workflowInfo();
    return this.context.notices.tell(deliveryHeldSignal, { workflowId, heldKey });
  }
}

/** True once the run's history is `budget` events long, or Temporal suggests continuing as new. */
function historyNearLimit(budget: number): boolean {
  const info = workflowInfo();
  return info.continueAsNewSuggested || info.historyLength >= budget;
}
