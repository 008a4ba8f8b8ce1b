import { defineQuery, patched, proxyActivities, setHandler } from '@temporalio/workflow';
import type { ActivityOptions } from '@temporalio/workflow';
import type { PipelineActivities } from '../activities';
import {
  FailureType,
  initialProgress,
  parseOrFail,
  refuseOtherSchemaVersions,
  PipelineInputSchema,
  PublishResultSchema,
  SummarizeResultSchema,
  TagResultSchema,
} from '../src/contract';
import type { PipelineProgress, PipelineResult, StepName, SummarizeResult, TagResult } from '../src/contract';

/** Live step states, for progress displays; answered from workflow memory, no history read needed. */
export const progressQuery = defineQuery<PipelineProgress>('progress');

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

/** Publish: the target (or the ledger in front of a webhook) dedupes by key, so retrying is safe. */
const publishOptions: ActivityOptions = {
  activityId: 'publish',
  startToCloseTimeout: '1 minute',
  heartbeatTimeout: '10 seconds',
  retry: {
    initialInterval: '5 seconds',
    backoffCoefficient: 2,
    maximumInterval: '10 minutes',
    // A refused payload fails alike on every attempt; the SDK marks argument-decoding failures retryable.
    nonRetryableErrorTypes: [FailureType.PayloadRefused],
  },
};

/**
 * Summarize, tag, publish one document. The event history is the checkpoint: after a crash, replay skips every
 * step whose completion is recorded, and only the unfinished step runs again, under the same idempotency key.
 * Each activity ID is the step name, so keys read `<runId>:summarize`, `<runId>:tag`, `<runId>:publish`.
 */
export async function documentPipeline(rawInput: unknown): Promise<PipelineResult> {
  refuseOtherSchemaVersions(rawInput);
  const input = parseOrFail(PipelineInputSchema, rawInput, 'pipeline input');
  const { documentId, textRef, title, options } = input;

  const progress = initialProgress(documentId);
  setHandler(progressQuery, () => progress);
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
  const { publish } = proxyActivities<PipelineActivities>({ ...publishOptions, ...budget });
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

  const summarizeStep = async () =>
    parseOrFail(
      SummarizeResultSchema,
      await step('summarize', () =>
        summarize({ documentId, textRef, maxSentences: options.maxSummarySentences }),
      ),
      'summarize result',
    );
  const tagStep = async () =>
    parseOrFail(
      TagResultSchema,
      await step('tag', () => tag({ documentId, textRef, maxTags: options.maxTags })),
      'tag result',
    );

  // Summarize and tag are independent model calls, so they run side by side. In histories written before this
  // change tag is scheduled only after summarize completed: `patched` is false when such a run is replayed, and it
  // keeps the sequential path. Remove that path once no run started before this deploy is open or still within
  // the namespace's retention (queries replay closed runs too): replace `patched` with
  // `deprecatePatch('parallel-model-steps')` and delete the else branch; drop deprecatePatch itself once the
  // runs started with `patched` are gone in the same way.
  let summary: SummarizeResult;
  let tags: TagResult;
  if (patched('parallel-model-steps')) {
    [summary, tags] = await Promise.all([summarizeStep(), tagStep()]);
  } else {
    summary = await summarizeStep();
    tags = await tagStep();
  }
  // scheduledAt orders this run's publication against other runs of the document (principle 8): workflow time is
  // deterministic (the current workflow task's start), fixed in the step's input for all its retries, and later in
  // every later run. Not workflowInfo().runStartTime: a reset to any but the first workflow task keeps the old
  // run's first task, so the reset run would report the same start time as the run it replaces.
  const publication = parseOrFail(
    PublishResultSchema,
    await step('publish', () =>
      publish({
        documentId,
        title,
        textRef,
        summary: summary.summary,
        tags: tags.tags,
        model: summary.model,
        scheduledAt: Date.now(),
      }),
    ),
    'publish result',
  );
  return { documentId, title, summary, tags, publication };
}
