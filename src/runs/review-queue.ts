import { randomUUID } from 'node:crypto';
import { WorkflowUpdateFailedError } from '@temporalio/client';
import type { Client } from '@temporalio/client';
import { registeredModelSteps } from '../steps/registry';
import { checkEdit } from '../steps/review-edits';
import { reviewQuery, reviewUpdate } from '../workflow/queries';
import type { DocumentPipeline } from '../contract';
import { workflowIdFor } from '../contract';
import { AWAITING_REVIEW_QUERY, describeOutcome, normalizeDecision } from '../contract/review';
import type { ReviewDecision, ReviewDraft, ReviewOutcome } from '../contract/review';

/** A draft in the reviewer's queue: its run and what the run answers about it. */
export interface QueuedDraft {
  workflowId: string;
  draft: ReviewDraft;
}

/** How long the queue waits for a run's draft: a query needs a worker, and none may be running. */
const DRAFT_QUERY_MS = 5_000;

/** The most runs the queue lists (one list call's pages) before it picks the oldest to ask for their drafts. */
const LISTED_MAX = 10_000;

/**
 * The drafts awaiting review, oldest first: one list call the server answers from its search-attribute index, then
 * one query per run for its draft, side by side, for the `limit` runs started longest ago (the server lists the
 * newest first). A run that decided meanwhile (the index lags by a moment) is left out; runs no worker answered for
 * are returned by workflow ID in `unanswered`.
 */
export async function awaitingReview(
  client: Client,
  limit = 200,
): Promise<QueuedDraft[] & { unanswered?: string[] }> {
  const listed: { workflowId: string; runId: string; startedAt: number }[] = [];
  for await (const run of client.workflow.list({ query: AWAITING_REVIEW_QUERY, pageSize: 1_000 })) {
    listed.push({ workflowId: run.workflowId, runId: run.runId, startedAt: run.startTime.getTime() });
    if (listed.length >= LISTED_MAX) break;
  }
  const runs = listed.sort((a, b) => a.startedAt - b.startedAt).slice(0, limit);
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

/** How many runs await review, by the server's count; undefined where it does not answer. */
export async function awaitingCount(client: Client): Promise<number | undefined> {
  try {
    return (await client.workflow.count(AWAITING_REVIEW_QUERY)).count;
  } catch {
    return undefined;
  }
}

/** The run a reviewer names: a document ID (`notes-1a2b`) or its workflow ID (`document-notes-1a2b`). */
export function reviewedWorkflowId(name: string): string {
  return name.startsWith('document-') ? name : workflowIdFor(name);
}

/**
 * Sends `decision` to the run under `updateId` (the same ID sent again, a retried request or a double click, gets
 * the first answer). An edit is first held to the rules of the steps that own its fields (src/steps/review-edits.ts)
 * and sent as their schemas read it. A decision refused here or by the run (malformed, late, already decided) comes
 * back as `refused` with the reason; any other error is thrown.
 */
export async function decide(
  client: Client,
  workflowId: string,
  decision: ReviewDecision,
  updateId: string = `review-${randomUUID()}`,
): Promise<{ ok: true; outcome: ReviewOutcome } | { ok: false; refused: string }> {
  try {
    let sent = decision;
    if (decision.action === 'edit') {
      const checked = await checkedEdit(client, workflowId, decision);
      if (!checked.ok) return { ok: false, refused: `invalid decision: ${checked.problem}` };
      sent = checked.decision;
    }
    const outcome = await client.workflow
      .getHandle(workflowId)
      .executeUpdate(reviewUpdate, { args: [sent], updateId });
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

/** The run's draft as it answers now; undefined without one, or when no worker answers in time. */
export function draftOf(client: Client, workflowId: string): Promise<ReviewDraft | undefined> {
  return client
    .withDeadline(Date.now() + DRAFT_QUERY_MS, () => client.workflow.getHandle(workflowId).query(reviewQuery))
    .catch(() => undefined);
}

/**
 * An edit held to the steps' rules against the draft it edits. Without a draft to read (none yet, or the run has
 * ended), the edit goes as it is and the run answers why it cannot take it.
 */
async function checkedEdit(
  client: Client,
  workflowId: string,
  decision: Extract<ReviewDecision, { action: 'edit' }>,
): Promise<{ ok: true; decision: ReviewDecision } | { ok: false; problem: string }> {
  const normalized = normalizeDecision(decision);
  if (normalized.action !== 'edit') return { ok: true, decision: normalized };
  const draft = await draftOf(client, workflowId);
  if (draft === undefined || draft.decided !== undefined) return { ok: true, decision: normalized };
  const checked = checkEdit(registeredModelSteps(), draft.fields, normalized.fields);
  if (!checked.ok) return checked;
  return { ok: true, decision: { ...normalized, fields: checked.fields } };
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
