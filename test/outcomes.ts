/** Result-table fixtures: the outcome of a document as the client reads it at the end of a run. */
import { stepNames } from '../src/steps/registry';
import '../src/cli/compose';
import type { ModelInfo, Usage } from '../src/contract';
import type { PipelineResult } from '../src/cli/compose';
import type { DocumentOutcome } from '../src/runs/result-table';

/**
 * The outcome of a document published in one go (revision 1, each step completed once), for result-table tests:
 * its title, tags and model, the tokens each model step used, and whether all of it was done before this session.
 */
export function publishedOutcome(
  title: string,
  {
    tags = ['t'],
    model = { provider: 'offline', model: 'extractive-wink-nlp' },
    usage = { inputTokens: 10, outputTokens: 2 },
    doneEarlier = false,
  }: { tags?: string[]; model?: ModelInfo; usage?: Usage; doneEarlier?: boolean } = {},
): DocumentOutcome {
  const result: PipelineResult = {
    documentId: title,
    title,
    summary: { summary: 'A summary.', idempotencyKey: 'r:summarize', model, usage, memoised: false },
    tags: { tags, idempotencyKey: 'r:tag', model, usage, memoised: false },
    publication: {
      idempotencyKey: 'r:publish',
      target: 'sqlite',
      documentId: title,
      revision: 1,
      duplicate: false,
    },
  };
  const steps = stepNames().map((step) => ({
    step,
    status: 'completed' as const,
    attempts: 1,
    worker: 'w',
    lastFailure: undefined,
    idempotencyKey: `r:${step}`,
    scheduledAt: 1,
    completedAt: 2,
    timeLostMs: 0,
    skippedOnResume: false,
    doneEarlier,
    memoised: false,
    usage: undefined,
    rejectedUsage: undefined,
    estimatedCostUsd: undefined,
  }));
  return {
    source: `${title}.md`,
    title,
    workflowId: `document-${title}`,
    result,
    error: undefined,
    report: { runId: 'r', steps, workers: ['w'] },
  };
}
