import { randomUUID } from 'node:crypto';
import { WorkflowUpdateFailedError } from '@temporalio/client';
import type { Client } from '@temporalio/client';
import { reviewQuery, reviewUpdate } from '../workflow/queries';
import type { DocumentPipeline } from '../contract';
import { workflowIdFor } from '../contract';
import { AWAITING_REVIEW_QUERY, describeOutcome } from '../contract/review';
import type { ReviewDecision, ReviewDraft, ReviewOutcome } from '../contract/review';

/** A draft in the reviewer's queue: its run and what the run answers about it. */
export interface QueuedDraft {
  workflowId: string;
  draft: ReviewDraft;
}

/** How long the queue waits for a run's draft: a query needs a worker, and none may be running. */
const DRAFT_QUERY_MS = 5_000;

/**
 * The drafts awaiting review, oldest first: one list call the server answers from its search-attribute index, then
 * one query per run for its draft, side by side. A run that decided meanwhile (the index lags by a moment) is left
 * out; runs no worker answered for are returned by workflow ID in `unanswered`.
 */
export async function awaitingReview(
  client: Client,
  limit = 200,
): Promise<QueuedDraft[] & { unanswered?: string[] }> {
  const runs: { workflowId: string; runId: string }[] = [];
  for await (const run of client.workflow.list({ query: AWAITING_REVIEW_QUERY, pageSize: limit })) {
    runs.push({ workflowId: run.workflowId, runId: run.runId });
    if (runs.length >= limit) break;
  }
  const answers = await Promise.all(
    runs.map(({ workflowId, runId }) =>
      Promise.race([
        client.workflow
          .getHandle(workflowId, runId)
          .query(reviewQuery)
          .then(
            (draft) => ({ workflowId, draft }),
            () => ({ workflowId, draft: undefined }),
          ),
        new Promise<{ workflowId: string; draft: 'unanswered' }>((resolve) =>
          setTimeout(() => resolve({ workflowId, draft: 'unanswered' }), DRAFT_QUERY_MS).unref(),
        ),
      ]),
    ),
  );
  const drafts: QueuedDraft[] & { unanswered?: string[] } = [];
  for (const { workflowId, draft } of answers) {
    if (draft === 'unanswered') (drafts.unanswered ??= []).push(workflowId);
    else if (draft !== undefined && draft.decided === undefined) drafts.push({ workflowId, draft });
  }
  return drafts.sort((a, b) => a.draft.awaitingSince - b.draft.awaitingSince);
}

/** The run a reviewer names: a document ID (`notes-1a2b`) or its workflow ID (`document-notes-1a2b`). */
export function reviewedWorkflowId(name: string): string {
  return name.startsWith('document-') ? name : workflowIdFor(name);
}

/**
 * Sends `decision` to the run under `updateId` (the same ID sent again, a retried request or a double click, gets
 * the first answer). A decision the run refuses (malformed, late, already decided) comes back as `refused` with the
 * run's reason; any other error is thrown.
 */
export async function decide(
  client: Client,
  workflowId: string,
  decision: ReviewDecision,
  updateId: string = `review-${randomUUID()}`,
): Promise<{ ok: true; outcome: ReviewOutcome } | { ok: false; refused: string }> {
  try {
    const outcome = await client.workflow
      .getHandle(workflowId)
      .executeUpdate(reviewUpdate, { args: [decision], updateId });
    return { ok: true, outcome };
  } catch (err) {
    if (err instanceof WorkflowUpdateFailedError)
      return { ok: false, refused: err.cause instanceof Error ? err.cause.message : err.message };
    const message = err instanceof Error ? err.message : String(err);
    if (!/workflow execution already completed|not found|aborted by closing workflow/i.test(message))
      throw err;
    // The run has ended: say how its review ended, where it had one.
    const ended = await endedReview(client, workflowId);
    return {
      ok: false,
      refused:
        ended === undefined
          ? `${workflowId} is not awaiting review (its run has ended without one, or there is none)`
          : `already decided: ${describeOutcome(ended)}`,
    };
  }
}

/** How the review of an ended run ended; undefined when it had none, or did not complete. */
async function endedReview(client: Client, workflowId: string): Promise<ReviewOutcome | undefined> {
  try {
    const handle = client.workflow.getHandle<DocumentPipeline>(workflowId);
    if ((await handle.describe()).status.name !== 'COMPLETED') return undefined;
    return (await handle.result()).review;
  } catch {
    return undefined;
  }
}
