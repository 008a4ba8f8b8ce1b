/**
 * A person's review before publish: what the run waits in, what a reviewer sends and what the run answers. Plain
 * values and types, no schema library (workflow code reads this on every run, as it reads src/contract/plain.ts); the
 * decision is checked here by hand, in the update's validator, so a malformed decision is refused before anything
 * is written to the history.
 */
import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';
import type { JsonValue, ModelInfo } from './values';

/**
 * The search attribute a run waiting for review is found by: `awaiting` while it waits, then how it ended
 * (REVIEW_OUTCOMES). The project's dev servers register it at start (src/temporal/tuning.ts); on a cluster,
 * `temporal operator search-attribute create --name ReviewStatus --type Keyword` (docs/review.md).
 */
export const REVIEW_STATUS = defineSearchAttributeKey('ReviewStatus', SearchAttributeType.KEYWORD);
/** The reviewer's queue: one list call the server answers from its index. */
export const AWAITING_REVIEW_QUERY = `ReviewStatus = "awaiting" AND ExecutionStatus = "Running"`;

/** What a review not given in time ends with: nothing published, or the draft published unreviewed. */
export const REVIEW_POLICIES = ['reject', 'publish'] as const;
export type ReviewPolicy = (typeof REVIEW_POLICIES)[number];

/** A run's review, as its input asks for it: absent, the run publishes without one. */
export interface ReviewSettings {
  /** How long the run waits for a decision, in minutes. */
  timeoutMinutes: number;
  /** What the run does when no decision came in time. */
  onTimeout: ReviewPolicy;
}
/** The longest a review may be waited for: 30 days. */
export const MAX_REVIEW_MINUTES = 30 * 24 * 60;

/**
 * What a reviewer decides: approve the draft, reject it with a reason, or edit the publication's fields; `sentAt`
 * is when the reviewer sent it (epoch ms, the kit's clients set it), which the run records as the decision's time
 * and past which, by DECISION_ANSWER_MS, the run refuses it.
 */
export type ReviewDecision = (
  | { action: 'approve'; reviewer: string }
  | { action: 'reject'; reviewer: string; reason: string }
  | { action: 'edit'; reviewer: string; fields: Record<string, JsonValue> }
) & { sentAt?: number };

/**
 * How long a decision may wait for a worker to take it. A client waits a little longer (DECISION_WAIT_MS), then
 * says that none did: a worker that starts later refuses the decision rather than apply it behind the reviewer's
 * back.
 */
export const DECISION_ANSWER_MS = 15_000;
export const DECISION_WAIT_MS = DECISION_ANSWER_MS + 5_000;

/** How a review ended: by a person's decision, or by the deadline and the run's policy. */
export const REVIEW_OUTCOMES = ['approved', 'edited', 'rejected', 'expired'] as const;
export type ReviewOutcomeName = (typeof REVIEW_OUTCOMES)[number];

export interface ReviewOutcome {
  outcome: ReviewOutcomeName;
  /** Who decided; absent when the deadline did. */
  reviewer?: string;
  /** A rejection's reason, or what the deadline did. */
  reason?: string;
  /** The fields the reviewer changed (an edit): what is published in place of the draft's. */
  edits?: Record<string, JsonValue>;
  /**
   * When the reviewer sent the decision (epoch ms; workflow time for a decision without `sentAt`, and for the
   * deadline), and how long the draft waited for it.
   */
  decidedAt: number;
  waitedMs: number;
  /** Expired only: what the run's policy did with the draft. */
  policy?: ReviewPolicy;
}

/** True when the review ends with the document published (approved, edited, or expired under `publish`). */
export function reviewPublishes(outcome: ReviewOutcome): boolean {
  return outcome.outcome !== 'rejected' && !(outcome.outcome === 'expired' && outcome.policy !== 'publish');
}

/** What a reviewer sees of a run that waits (the review query): the draft, and how long it may wait. */
export interface ReviewDraft {
  documentId: string;
  title: string;
  textRef: string;
  /** The publication's fields as drafted (`summary`, `tags`, ...). */
  fields: Record<string, JsonValue>;
  model: ModelInfo;
  /** What the draft's model calls cost, in US dollars; null where the model has no price. */
  costUsd: number | null;
  /** Workflow time (epoch ms) the run began waiting, and the deadline. */
  awaitingSince: number;
  deadline: number;
  onTimeout: ReviewPolicy;
  /** Once decided: the decision. */
  decided?: ReviewOutcome;
}

/** What the publication records of its review (in its fields, as `review`). */
export interface PublishedReview {
  outcome: 'approved' | 'edited' | 'expired';
  reviewer?: string;
  decidedAt: number;
}

export const REVIEWER_MAX = 200;
export const REASON_MAX = 2_000;

/**
 * Why `decision` cannot be taken for this draft (a sentence that says what to fix), or undefined when it can.
 * An edit may change the draft's fields only, each to a value of the same kind: a text to a non-empty text, a list
 * of texts to a list of non-empty texts (to publish nothing, reject). How long or how many is each step's own rule
 * (its `fields` schema), which the run cannot read: the kit's client holds an edit to it before sending it
 * (src/steps/review-edits.ts).
 */
export function decisionProblem(decision: unknown, fields: Record<string, JsonValue>): string | undefined {
  if (typeof decision !== 'object' || decision === null || Array.isArray(decision))
    return 'a decision is an object: {"action": "approve" | "reject" | "edit", "reviewer": "...", ...}';
  const d = decision as Record<string, unknown>;
  const { action, reviewer } = d;
  if (action !== 'approve' && action !== 'reject' && action !== 'edit')
    return `"action" must be approve, reject or edit, not ${JSON.stringify(action) ?? 'missing'}`;
  if (typeof reviewer !== 'string' || reviewer.trim() === '' || reviewer.length > REVIEWER_MAX)
    return `"reviewer" must name who decides (1-${REVIEWER_MAX} characters)`;
  const allowed = action === 'reject' ? ['reason'] : action === 'edit' ? ['fields'] : [];
  const known = ['action', 'reviewer', 'sentAt', ...allowed];
  const unknown = Object.keys(d).filter((k) => !known.includes(k));
  if (unknown.length > 0) return `unknown field(s) ${unknown.map((k) => `"${k}"`).join(', ')} for ${action}`;
  if (d.sentAt !== undefined && (typeof d.sentAt !== 'number' || !Number.isSafeInteger(d.sentAt)))
    return '"sentAt" must be the time the decision was sent, in epoch milliseconds';
  if (action === 'reject') {
    const { reason } = d;
    if (typeof reason !== 'string' || reason.trim() === '' || reason.length > REASON_MAX)
      return `a rejection needs a "reason" (1-${REASON_MAX} characters) saying why`;
  }
  if (action === 'edit') return editProblem(d.fields, fields);
  return undefined;
}

function editProblem(edits: unknown, fields: Record<string, JsonValue>): string | undefined {
  if (typeof edits !== 'object' || edits === null || Array.isArray(edits) || Object.keys(edits).length === 0)
    return `an edit needs "fields": the fields to change, of ${Object.keys(fields).join(', ')}`;
  for (const [name, value] of Object.entries(edits as Record<string, unknown>)) {
    if (!Object.hasOwn(fields, name))
      return `"${name}" is not a field of this draft; its fields are ${Object.keys(fields).join(', ')}`;
    const drafted = fields[name];
    if (typeof drafted === 'string') {
      if (typeof value !== 'string' || value.trim() === '') return `"${name}" must be a non-empty text`;
    } else if (Array.isArray(drafted) && drafted.every((item) => typeof item === 'string')) {
      if (!Array.isArray(value) || !value.every((item) => typeof item === 'string' && item.trim() !== ''))
        return `"${name}" must be a list of non-empty texts`;
    } else return `"${name}" cannot be edited here (only texts and lists of texts can)`;
  }
  return undefined;
}

/** The decision as the run keeps it: names trimmed, a list's items trimmed, nothing else changed. */
export function normalizeDecision(decision: ReviewDecision): ReviewDecision {
  const reviewer = decision.reviewer.trim();
  const sent = decision.sentAt === undefined ? {} : { sentAt: decision.sentAt };
  if (decision.action === 'approve') return { action: 'approve', reviewer, ...sent };
  if (decision.action === 'reject')
    return { action: 'reject', reviewer, reason: decision.reason.trim(), ...sent };
  const fields = Object.fromEntries(
    Object.entries(decision.fields).map(([name, value]) => [
      name,
      typeof value === 'string'
        ? value.trim()
        : Array.isArray(value)
          ? value.map((item) => (typeof item === 'string' ? item.trim() : item))
          : value,
    ]),
  );
  return { action: 'edit', reviewer, fields, ...sent };
}

/** One line for a decided review: `approved by ana at 2026-12-03T10:00:00.000Z`. */
export function describeOutcome(outcome: ReviewOutcome): string {
  const when = new Date(outcome.decidedAt).toISOString();
  if (outcome.outcome === 'expired')
    return `expired unreviewed at ${when}; ${outcome.policy === 'publish' ? 'published as drafted' : 'not published'}`;
  const what = outcome.outcome === 'rejected' ? `rejected ("${outcome.reason ?? ''}")` : outcome.outcome;
  return `${what} by ${outcome.reviewer ?? 'unknown'} at ${when}`;
}

/** The review's line in `npm run report`: awaiting since when and until when, or how it ended. */
export function describeReview(draft: ReviewDraft): string {
  if (draft.decided !== undefined) return `Review: ${describeOutcome(draft.decided)}`;
  return (
    `Review: ⏸ awaiting since ${new Date(draft.awaitingSince).toISOString()}, deadline ` +
    `${new Date(draft.deadline).toISOString()} (then ${draft.onTimeout === 'publish' ? 'published as drafted' : 'rejected'}); ` +
    'npm run review'
  );
}
