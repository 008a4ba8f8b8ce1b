import { proxyActivities, setHandler, workflowInfo } from '@temporalio/workflow';
import type { PipelineContinuation, StepResultsBeforePublish } from '../contract';
import {
  initialProgress,
  isModelStepFields,
  MODEL_STEP_FIELD_NAMES,
  modelStepResults,
  PUBLISH_STEP,
  stepNameOfKey,
} from '../contract/plain';
import type {
  CompletePipelineInput,
  JsonValue,
  ModelInfo,
  PipelineProgress,
  PipelineResult,
} from '../contract/plain';
import { reviewPublishes } from '../contract/review';
import type { PublishedReview, ReviewOutcome } from '../contract/review';
import type { DocumentStepInput, StepFields } from '../steps/define';
import type { AgentStepResult, AgentTurnActivity } from '../steps/agent';
import { runAgentStep } from './agent';
import { checkedPipelineInput } from './checks';
import { publishUntilSettled } from './held-publish';
import { BatchNotices } from './notices';
import { progressQuery, reviewWaitSignal } from './queries';
import { reviewDesk } from './review';
import { modelStepOptions } from './options';
import { budgetWaiter, tracked } from './waits';

type AnyActivity = (input: never) => Promise<unknown>;
/** The model steps among a map of activities: those whose input is a document's. */
type ModelStepNames<A> = {
  [N in keyof A & string]: A[N] extends (input: infer I) => Promise<unknown>
    ? I extends DocumentStepInput
      ? I extends { turn: number }
        ? never
        : N
      : never
    : never;
}[keyof A & string];
/** The agent steps among a map of activities: those whose turn takes the loop's input. */
type AgentStepNames<A> = {
  [N in keyof A & string]: A[N] extends AgentTurnActivity<infer _I, infer _F> ? N : never;
}[keyof A & string];
type AgentResultOf<F> =
  F extends AgentTurnActivity<object, infer Fields extends StepFields> ? AgentStepResult<Fields> : never;
type AgentInputOf<F> = F extends AgentTurnActivity<infer I extends object, StepFields> ? I : never;
type OwnInputOf<F> = F extends (input: infer I) => Promise<unknown>
  ? Omit<I, keyof DocumentStepInput>
  : never;
type ResultOf<F> = F extends (input: never) => Promise<infer R> ? R : never;

/** A document's run as the workflow sees it: its checked input, and its model steps to call. */
export interface DocumentRun<A> {
  readonly input: CompletePipelineInput;
  /**
   * Runs a model step under its name (its activity ID, so its key reads `<runId>:<name>`), with the document and
   * the run's budget added to its own input; pauses while its next call would pass the budget.
   */
  step<N extends ModelStepNames<A>>(name: N, input: OwnInputOf<A[N]>): Promise<ResultOf<A[N]>>;
  /**
   * Runs an agent step's loop (src/workflow/agent.ts) when the run's input turns agent steps on (AGENT=on);
   * undefined when it does not, without a command: runs that predate agent steps replay as they ran.
   */
  agent<N extends AgentStepNames<A>>(
    name: N,
    input: AgentInputOf<A[N]>,
  ): Promise<AgentResultOf<A[N]> | undefined>;
}

/**
 * One document's run around the steps that draft its publication (`draft`, the workflow's own lines): the input
 * check, progress, the steps' budgets, the review before publish, and the publish that waits out a held delivery,
 * continuing as new while it waits. A run that continued as new while held goes straight back to that publish,
 * with the drafted results it carried: `draft` does not run again.
 *
 * The event history is the checkpoint: after a crash, replay skips every step whose completion is recorded, and
 * only the unfinished step runs again, under the same idempotency key.
 */
export async function runDocument<A extends Record<keyof A, AnyActivity>, R extends StepResultsBeforePublish>(
  rawInput: unknown,
  continuation: PipelineContinuation,
  draft: (run: DocumentRun<A>) => Promise<R>,
): Promise<PipelineResult<R>> {
  const input = await checkedPipelineInput(rawInput);
  const { documentId, title } = input;
  const progress = initialProgress(documentId);
  setHandler(progressQuery, () => progress);
  const notices = new BatchNotices(progress, continuation.held?.watchers ?? []);
  const desk = reviewDesk(progress);
  const budget = { scheduleToCloseTimeout: `${input.options.stepBudgetMinutes} minutes` } as const;
  const held = { input, notices, continuation };

  const carried = continuation.held;
  if (carried !== undefined) {
    for (const result of modelStepResults(carried.results))
      progress.steps[stepNameOfKey(result.idempotencyKey)] = 'done';
    const publication = await tracked(progress, PUBLISH_STEP, () =>
      publishUntilSettled(carried.publish, budget, progress, { ...held, results: carried.results }),
    );
    return { documentId, title, ...(carried.results as R), publication };
  }

  const results = await draft(documentSteps<A>(input, progress, budgetWaiter(progress, notices)));
  const fields = publicationFields(results);
  const model = modelOf(results);
  // A run with a review waits here for a person (or the deadline): an edit is what is published, a rejection ends
  // the run with nothing published.
  let review: ReviewOutcome | undefined;
  if (input.review !== undefined) {
    const drafted = { documentId, title, textRef: input.textRef, fields, model, costUsd: costOf(results) };
    review = await desk.await(drafted, input.review, (awaiting) =>
      notices.tell(reviewWaitSignal, { workflowId: workflowInfo().workflowId, awaiting }),
    );
    if (!reviewPublishes(review)) return { documentId, title, ...results, review };
  }
  // scheduledAt orders this run's publication against other runs of the document, so that a late publication of
  // an older run never overwrites a newer one (docs/recovery.md): workflow time is deterministic, fixed in the
  // step's input for all its retries, and later in every later run. Not workflowInfo().runStartTime: a reset keeps
  // the old run's first task, so the reset run would report the same start time as the run it replaces.
  const publishInput = {
    documentId,
    title,
    textRef: input.textRef,
    ...fields,
    ...review?.edits,
    ...(review === undefined ? {} : { review: publishedReview(review) }),
    model,
    scheduledAt: Date.now(),
  };
  // A held delivery (it may have landed unanswered: a person, or the receiver's lookup, must say) is a state of
  // the run, shown by its progress and its batch, not a retry that the step budget ends.
  const publication = await tracked(progress, PUBLISH_STEP, () =>
    publishUntilSettled(publishInput, budget, progress, { ...held, results }),
  );
  return { documentId, title, ...results, publication, ...(review === undefined ? {} : { review }) };
}

/** The run's model steps: each proxied under its name, with the run's timeouts, progress and budget waits. */
function documentSteps<A>(
  input: CompletePipelineInput,
  progress: PipelineProgress,
  withinBudget: ReturnType<typeof budgetWaiter>,
): DocumentRun<A> {
  const { documentId, textRef, options } = input;
  // A budget is passed on only where the run has one, so the steps' inputs are what they always were without.
  const spending = input.budget === undefined ? {} : { budget: input.budget };
  const timeouts = {
    scheduleToCloseTimeout: `${options.stepBudgetMinutes} minutes`,
    startToCloseTimeout: `${options.modelTimeoutSeconds} seconds`,
  } as const;
  return {
    input,
    step(name, own) {
      const activities = proxyActivities<Record<string, (input: object) => Promise<unknown>>>({
        ...modelStepOptions,
        ...timeouts,
        activityId: name,
      });
      const activity = activities[name];
      if (activity === undefined) throw new Error(`no activity ${name}`);
      return tracked(progress, name, () =>
        withinBudget(name, () => activity({ documentId, textRef, ...own, ...spending })),
      ) as Promise<ResultOf<A[typeof name]>>;
    },
    agent(name, own) {
      if (input.agent === undefined) return Promise.resolve(undefined);
      return tracked(progress, name, () => runAgentStep(name, own, input)) as Promise<
        AgentResultOf<A[typeof name]> | undefined
      >;
    },
  };
}

/**
 * The publication's fields: each model step's result less what every model step's result carries (the key, the
 * model, tokens, cost), in step order: `{ summary }`, `{ tags }`.
 */
function publicationFields(results: StepResultsBeforePublish): Record<string, JsonValue> {
  const fields: Record<string, JsonValue> = {};
  for (const result of Object.values(results)) {
    if (!isModelStepFields(result)) continue;
    for (const [name, value] of Object.entries(result))
      if (!MODEL_STEP_FIELD_NAMES.includes(name)) fields[name] = value as JsonValue;
  }
  return fields;
}

/** The model that made the results: the first model step's, which the publication records. */
function modelOf(results: StepResultsBeforePublish): ModelInfo {
  const first = modelStepResults(results)[0];
  if (first === undefined) throw new Error('a run has no model step result to name its model');
  return first.model;
}

/** What the draft's model calls cost in US dollars; null when a model had no price. */
function costOf(results: StepResultsBeforePublish): number | null {
  let total = 0;
  for (const answer of modelStepResults(results)) {
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
