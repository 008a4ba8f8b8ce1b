import * as otel from '@opentelemetry/api';
import {
  allHandlersFinished,
  condition,
  patched,
  proxySinks,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { Sinks } from '@temporalio/workflow';
import { ApplicationFailure } from '@temporalio/common';
import {
  DECISION_ANSWER_MS,
  decisionProblem,
  describeOutcome,
  normalizeDecision,
  REVIEW_STATUS,
} from '../contract/review';
import type { ReviewDecision, ReviewDraft, ReviewOutcome, ReviewSettings } from '../contract/review';
import type { PipelineProgress } from '../contract/plain';
import { reviewQuery, reviewUpdate } from './queries';

/** What the worker records of each review (src/telemetry/metrics.ts); sinks are not called on replay. */
export interface ReviewSinks extends Sinks {
  review: {
    decided(outcome: string, waitedSeconds: number): void;
  };
}
const { review: reviewSink } = proxySinks<ReviewSinks>();

/** The draft a review is about: what the publication would carry, and who made it at what cost. */
export type DraftOf = Omit<ReviewDraft, 'awaitingSince' | 'deadline' | 'onTimeout' | 'decided'>;

/**
 * Sets the run's review handlers: the query answers nothing until the draft is ready; the update refuses every
 * decision until then (said why). Called at the start of every run, so a decision sent early is told to wait
 * rather than left unanswered.
 */
export function reviewDesk(progress: PipelineProgress): ReviewDesk {
  return new ReviewDesk(progress);
}

/** A run's review: its draft while it waits, the decision the update takes, and the wait for it. */
class ReviewDesk {
  private open: ReviewDraft | undefined;

  constructor(private readonly progress: PipelineProgress) {
    setHandler(reviewQuery, () => this.open);
    setHandler(reviewUpdate, (decision: ReviewDecision) => this.decide(decision), {
      description: 'approve, reject (with a reason) or edit the draft before it is published',
      validator: (decision: ReviewDecision): void => this.validate(decision),
    });
  }

  /** Waits for a person's decision on the draft, or the deadline; returns how the review ended. */
  async await(
    draft: DraftOf,
    settings: ReviewSettings,
    tell: (awaiting: boolean) => Promise<void>,
  ): Promise<ReviewOutcome> {
    const since = Date.now();
    const deadline = since + settings.timeoutMinutes * 60_000;
    const waiting: ReviewDraft = { ...draft, awaitingSince: since, deadline, onTimeout: settings.onTimeout };
    this.open = waiting;
    this.progress.review = 'awaiting';
    upsertSearchAttributes([{ key: REVIEW_STATUS, value: 'awaiting' }]);
    const span = otel.trace
      .getTracer('document-pipeline')
      .startSpan('Review', { startTime: since, attributes: { onTimeout: settings.onTimeout } });
    await tell(true);
    // The wait ends once the update's handler has returned, not as soon as it set the decision: interceptors
    // around the handler (tracing's) add awaits to it, and the timer's cancel would otherwise come before the
    // update's completion with them and after it without, a history a worker of the other kind cannot replay.
    // Runs recorded before wait as they did (patched() false).
    const afterHandlers = patched('review-ends-after-its-update');
    const decidedInTime = await condition(
      () => waiting.decided !== undefined && (!afterHandlers || allHandlersFinished()),
      deadline - since,
    );
    const outcome: ReviewOutcome =
      decidedInTime && waiting.decided !== undefined
        ? waiting.decided
        : (waiting.decided = {
            outcome: 'expired',
            policy: settings.onTimeout,
            decidedAt: Date.now(),
            waitedMs: Date.now() - since,
          });
    this.progress.review = outcome.outcome;
    upsertSearchAttributes([{ key: REVIEW_STATUS, value: outcome.outcome }]);
    reviewSink.decided(outcome.outcome, outcome.waitedMs / 1000);
    span.setAttributes({
      outcome: outcome.outcome,
      ...(outcome.reviewer === undefined ? {} : { reviewer: outcome.reviewer }),
    });
    span.end(Date.now());
    await tell(false);
    return outcome;
  }

  /** The update's validator: a decision is refused, leaving no trace in the history, unless it can be taken now. */
  private validate(decision: ReviewDecision): void {
    const refuse = (message: string): never => {
      throw ApplicationFailure.create({ type: 'ReviewRefused', nonRetryable: true, message });
    };
    const draft = this.open;
    if (draft === undefined)
      return refuse(
        this.progress.review === undefined
          ? `${workflowInfo().workflowId} has no draft awaiting review yet (its model steps are under way, or ` +
              'the run was started without a review)'
          : `${workflowInfo().workflowId} has no draft awaiting review`,
      );
    if (draft.decided !== undefined) refuse(`already decided: ${describeOutcome(draft.decided)}`);
    if (Date.now() >= draft.deadline)
      refuse(`too late: the review's deadline passed at ${new Date(draft.deadline).toISOString()}`);
    const problem = decisionProblem(decision, draft.fields);
    if (problem !== undefined) refuse(`invalid decision: ${problem}`);
    // A decision no worker took in time was answered as not taken (src/runs/review-queue.ts): never apply it now.
    if (decision.sentAt !== undefined && Date.now() - decision.sentAt > DECISION_ANSWER_MS)
      refuse(
        `too late: sent at ${new Date(decision.sentAt).toISOString()}, it waited more than ` +
          `${DECISION_ANSWER_MS / 1000} s for a worker, and its sender was told it was not taken; decide again`,
      );
  }

  /** The update's handler: takes the decision the validator accepted, unless another won in the same activation. */
  private decide(decision: ReviewDecision): ReviewOutcome {
    const draft = this.open;
    if (draft === undefined || draft.decided !== undefined)
      throw ApplicationFailure.create({
        type: 'ReviewRefused',
        nonRetryable: true,
        message: `already decided: ${draft?.decided === undefined ? 'no draft' : describeOutcome(draft.decided)}`,
      });
    const taken = normalizeDecision(decision);
    // The reviewer's time, within what the run knows: not before the draft, not after the run's now.
    const decidedAt = Math.max(draft.awaitingSince, Math.min(taken.sentAt ?? Date.now(), Date.now()));
    const outcome: ReviewOutcome = {
      outcome: taken.action === 'approve' ? 'approved' : taken.action === 'reject' ? 'rejected' : 'edited',
      reviewer: taken.reviewer,
      ...(taken.action === 'reject' ? { reason: taken.reason } : {}),
      ...(taken.action === 'edit' ? { edits: taken.fields } : {}),
      decidedAt,
      waitedMs: decidedAt - draft.awaitingSince,
    };
    draft.decided = outcome;
    return outcome;
  }
}
