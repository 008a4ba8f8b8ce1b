import { randomUUID } from 'node:crypto';
import { ServiceError, WorkflowUpdateFailedError } from '@temporalio/client';
import type { Client } from '@temporalio/client';
import { registeredModelSteps } from '../steps/registry';
import { checkEdit } from '../steps/review-edits';
import { reviewQuery, reviewUpdate } from '../workflow/queries';
import type { DocumentPipeline } from '../contract';
import { workflowIdFor } from '../contract';
import {
  AWAITING_REVIEW_QUERY,
  DECISION_WAIT_MS,
  describeOutcome,
  normalizeDecision,
} from '../contract/review';
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

/** The most runs the queue lists (one list call's pages) before it picks the oldest to ask for their drafts. */
const LISTED_MAX = 10_000;

/**
 * The drafts awaiting review, oldest first: one list call the server answers from its search-attribute index, then
 * one query per run for its draft, side by side, each cancelled at its deadline, for the `limit` runs started
 * longest ago (the server lists the newest first). A run that decided meanwhile (the index lags by a moment) is left
 * out; runs no worker answered for are returned by workflow ID in `unanswered`, runs whose query failed in `failed`.
 */
export async function awaitingReview(client: Client, limit = 200): Promise<ReviewQueue> {
  const listed = await client
    .withDeadline(Date.now() + LIST_MS, async () => {
      const found: { workflowId: string; runId: string; startedAt: number }[] = [];
      for await (const run of client.workflow.list({ query: AWAITING_REVIEW_QUERY, pageSize: 1_000 })) {
        found.push({ workflowId: run.workflowId, runId: run.runId, startedAt: run.startTime.getTime() });
        if (found.length >= LISTED_MAX) break;
      }
      return found;
    })
    .catch((err: unknown) => {
      // The list is a plain read: a call that fails (refused, reset, timed out) is the server not answering.
      throw err instanceof ServiceError || timedOut(err) || unavailable(err)
        ? new ServerUnavailableError(err)
        : err;
    });
  const runs = listed.sort((a, b) => a.startedAt - b.startedAt).slice(0, limit);
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

/** How many runs await review, by the server's count; undefined where it does not answer. */
export async function awaitingCount(client: Client): Promise<number | undefined> {
  try {
    return (
      await client.withDeadline(Date.now() + LIST_MS, () => client.workflow.count(AWAITING_REVIEW_QUERY))
    ).count;
  } catch {
    return undefined;
  }
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
 * the first answer), stamped with the time it is sent. An edit is first held to the rules of the steps that own
 * its fields (src/steps/review-edits.ts) and sent as their schemas read it. A decision refused here or by the run
 * (malformed, late, already decided) comes back as `refused` with the reason, and so does one no worker took within
 * DECISION_WAIT_MS: the run refuses it if a worker takes it later. A server that does not answer is a
 * ServerUnavailableError; any other error is thrown.
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
  try {
    let checkedDecision = decision;
    if (decision.action === 'edit') {
      const checked = await checkedEdit(client, workflowId, decision);
      if (!checked.ok) return { ok: false, refused: `invalid decision: ${checked.problem}` };
      checkedDecision = checked.decision;
    }
    // Stamped once checked, as it goes: the run measures the wait for a worker from here (DECISION_WAIT_MS).
    const sent: ReviewDecision = { ...checkedDecision, sentAt: decision.sentAt ?? Date.now() };
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
