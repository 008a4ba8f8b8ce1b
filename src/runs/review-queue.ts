import { randomUUID } from 'node:crypto';
import { ServiceError, WorkflowUpdateFailedError } from '@temporalio/client';
import type { Client } from '@temporalio/client';
import { reviewQuery, reviewUpdate } from '../workflow/queries';
import type { DocumentPipeline } from '../contract';
import { workflowIdFor } from '../contract';
import { AWAITING_REVIEW_QUERY, DECISION_WAIT_MS, describeOutcome } from '../contract/review';
import type { ReviewDecision, ReviewDraft, ReviewOutcome } from '../contract/review';

/** A draft in the reviewer's queue: its run and what the run answers about it. */
export interface QueuedDraft {
  workflowId: string;
  draft: ReviewDraft;
}

/** How long the queue waits for a run's draft: a query needs a worker, and none may be running. */
const DRAFT_QUERY_MS = 5_000;
/** How long the queue waits for the server's list: a server that is down is said so, not waited on. */
const LIST_MS = 10_000;

/** The queue: the drafts, oldest first, and the runs that await review but did not show their draft. */
export type ReviewQueue = QueuedDraft[] & {
  /** Runs no worker answered for within DRAFT_QUERY_MS (their queries cancelled). */
  unanswered?: string[];
  /** Runs whose query failed, with the error: a run that cannot show its draft is never taken for "no draft". */
  failed?: { workflowId: string; error: string }[];
};

/**
 * The drafts awaiting review, oldest first: one list call the server answers from its search-attribute index, then
 * one query per run for its draft, side by side, each cancelled at its deadline. A run that decided meanwhile (the
 * index lags by a moment) is left out; runs no worker answered for are returned by workflow ID in `unanswered`,
 * runs whose query failed in `failed`.
 */
export async function awaitingReview(client: Client, limit = 200): Promise<ReviewQueue> {
  const runs = await client
    .withDeadline(Date.now() + LIST_MS, async () => {
      const listed: { workflowId: string; runId: string }[] = [];
      for await (const run of client.workflow.list({ query: AWAITING_REVIEW_QUERY, pageSize: limit })) {
        listed.push({ workflowId: run.workflowId, runId: run.runId });
        if (listed.length >= limit) break;
      }
      return listed;
    })
    .catch((err: unknown) => {
      // The list is a plain read: a call that fails (refused, reset, timed out) is the server not answering.
      throw err instanceof ServiceError || timedOut(err) || unavailable(err)
        ? new ServerUnavailableError(err)
        : err;
    });
  const answers = await Promise.all(
    runs.map(({ workflowId, runId }) =>
      client
        .withDeadline(Date.now() + DRAFT_QUERY_MS, () =>
          client.workflow.getHandle(workflowId, runId).query(reviewQuery),
        )
        .then(
          (draft) => ({ workflowId, draft }),
          (err: unknown) => ({ workflowId, draft: timedOut(err) ? ('unanswered' as const) : errorOf(err) }),
        ),
    ),
  );
  const drafts: ReviewQueue = [];
  for (const { workflowId, draft } of answers) {
    if (draft === 'unanswered') (drafts.unanswered ??= []).push(workflowId);
    else if (draft instanceof Error) (drafts.failed ??= []).push({ workflowId, error: draft.message });
    else if (draft !== undefined && draft.decided === undefined) drafts.push({ workflowId, draft });
  }
  return drafts.sort((a, b) => a.draft.awaitingSince - b.draft.awaitingSince);
}

/** The Temporal server did not answer (down, or unreachable): said as such, with what the client saw. */
export class ServerUnavailableError extends Error {
  constructor(cause: unknown) {
    super(
      `The Temporal server does not answer (${errorOf(cause).message}): start it (npm run server) or check ` +
        'TEMPORAL_ADDRESS, then try again.',
      { cause },
    );
    this.name = 'ServerUnavailableError';
  }
}

/** gRPC's status codes: a call that ended at its deadline or was cancelled, a server not reached. */
const CANCELLED = 1;
const DEADLINE_EXCEEDED = 4;
const UNAVAILABLE = 14;

/** True when a call ended at its deadline (or was cancelled), the error's causes included. */
function timedOut(err: unknown): boolean {
  return hasCode(err, [DEADLINE_EXCEEDED, CANCELLED]);
}

/** True when the server was not reached. */
function unavailable(err: unknown): boolean {
  return hasCode(err, [UNAVAILABLE]);
}

function hasCode(err: unknown, codes: number[]): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'number' && codes.includes(code)) return true;
  }
  return false;
}

function errorOf(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}

/** The run a reviewer names: a document ID (`notes-1a2b`) or its workflow ID (`document-notes-1a2b`). */
export function reviewedWorkflowId(name: string): string {
  return name.startsWith('document-') ? name : workflowIdFor(name);
}

/**
 * Sends `decision` to the run under `updateId` (the same ID sent again, a retried request or a double click, gets
 * the first answer), stamped with the time it is sent. A decision the run refuses (malformed, late, already
 * decided) comes back as `refused` with the run's reason, and so does one no worker took within DECISION_WAIT_MS:
 * the run refuses it if a worker takes it later. A server that does not answer is a ServerUnavailableError; any
 * other error is thrown.
 */
export async function decide(
  client: Client,
  workflowId: string,
  decision: ReviewDecision,
  updateId: string = `review-${randomUUID()}`,
): Promise<{ ok: true; outcome: ReviewOutcome } | { ok: false; refused: string }> {
  // An empty name (a form's missing field, `npm run review -- approve ""`) would reach the server as a bad request.
  if (workflowId.replace(/^document-/, '') === '' || /[\s\p{Cc}]/u.test(workflowId))
    return {
      ok: false,
      refused:
        `${JSON.stringify(workflowId)} names no document's run: give a document ID (notes-1a2b) or its ` +
        'workflow ID (document-notes-1a2b), as npm run review lists them',
    };
  const sent: ReviewDecision = { ...decision, sentAt: decision.sentAt ?? Date.now() };
  try {
    const outcome = await client.withDeadline(Date.now() + DECISION_WAIT_MS, () =>
      client.workflow.getHandle(workflowId).executeUpdate(reviewUpdate, { args: [sent], updateId }),
    );
    return { ok: true, outcome };
  } catch (err) {
    if (err instanceof WorkflowUpdateFailedError)
      return { ok: false, refused: err.cause instanceof Error ? err.cause.message : err.message };
    if (timedOut(err))
      return {
        ok: false,
        refused:
          `no worker took the decision within ${DECISION_WAIT_MS / 1000} s, so it was not taken (a worker that ` +
          'starts later refuses it): start one (npm run worker) and decide again',
      };
    if (unavailable(err)) throw new ServerUnavailableError(err);
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
