import { createHash } from 'node:crypto';
import { canonicalJson } from '../lib/canonical-json';
import { z } from 'zod';
import { ModelInfoSchema, UsageSchema } from '../contract';

export const StoredAnswerSchema = z.object({
  value: z.unknown(),
  usage: UsageSchema,
  model: ModelInfoSchema,
  /** Bought as a line of a provider batch (bulk mode): the claim of that batch, and so the batch price. */
  bulkClaim: z.string().optional(),
  /** The step's identity when it was asked (src/steps/identity.ts); absent in entries stored before it. */
  identity: z.string().optional(),
});
export type StoredAnswer = z.infer<typeof StoredAnswerSchema>;

/** A paid answer the step refused (cut off, not the asked-for shape): its tokens still count in the run's cost. */
export const RejectedAnswerSchema = z.object({
  runId: z.string(),
  usage: UsageSchema,
  model: ModelInfoSchema,
  error: z.string(),
  /** Bought as a line of a provider batch (bulk mode), as StoredAnswer's. */
  bulkClaim: z.string().optional(),
});
export type RejectedAnswer = z.infer<typeof RejectedAnswerSchema>;
export const RejectedListSchema = z.array(RejectedAnswerSchema);

/** Which model request a memo entry answers. */
export interface MemoRequest {
  /** `<workflowId>:<step>:<request hash>`: see memoKeyFor. */
  memoKey: string;
  workflowId: string;
  /** The run asking now; provider failures and rejected answers are counted per run. */
  runId: string;
  step: string;
  requestHash: string;
}

export type Claim =
  /**
   * The entry holds a paid answer: use it, do not call the model. `rejected` are the answers this run paid for and
   * refused before it: part of the step's cost however the answer is reached.
   */
  | { kind: 'answered'; answer: StoredAnswer; rejected: RejectedAnswer[] }
  /** The caller owns the entry until its lease runs out: call the model, then complete or release. */
  | { kind: 'owned'; providerFailures: number; rejected: RejectedAnswer[] }
  /** Another attempt owns a live lease (it is calling the model now): wait and claim again. */
  | { kind: 'held'; owner: string; leaseUntil: Date };

/** How an owner gives up its claim without an answer. */
export interface Release {
  /** The provider failed (an error status, a timeout): counted toward the run's bounded provider errors. */
  providerFailure?: boolean;
  /** The provider answered and was paid, but the answer was refused: kept with its usage, and counted too. */
  rejected?: RejectedAnswer;
}

/**
 * The durable memo of paid model answers, shared by every worker of the fleet. A step claims its entry before
 * it calls the model (dedupe before effect): only the owner of a live lease calls; another attempt that finds the
 * claim waits for the answer, and takes over only once the lease has run out (its owner died or stalled). The
 * owner keeps its lease alive while it works, and the answer is stored before the activity returns it.
 */
export interface AnswerMemo {
  claim(request: MemoRequest, owner: string, leaseMs: number): Promise<Claim>;
  /** Extends the owner's lease; false when the owner no longer holds the entry (its lease ran out and was taken). */
  renew(memoKey: string, owner: string, leaseMs: number): Promise<boolean>;
  /** Stores the paid answer and ends the claim. The first answer stored wins and is returned, whoever paid it. */
  complete(memoKey: string, answer: StoredAnswer): Promise<StoredAnswer>;
  /** Ends the owner's claim without an answer; returns the run's provider failures so far. */
  release(memoKey: string, owner: string, release: Release): Promise<number>;
  /**
   * What the memo holds for each of `memoKeys`, without claiming any (bulk mode reads it before it submits a
   * provider batch): whether it has an answer, and the answers `runId` paid for and refused. Keys it lacks are absent.
   */
  peek(memoKeys: readonly string[], runId: string): Promise<Map<string, MemoEntryView>>;
  /**
   * The answer most recently stored for this document's step under another key (`memoKey` is the one asked now):
   * what the step answered before its identity or input changed. Undefined when there is none.
   */
  previousAnswer(workflowId: string, step: string, memoKey: string): Promise<StoredAnswer | undefined>;
  /** Number of stored answers (for reports and tests). */
  count(): Promise<number>;
  /** Deletes entries untouched since `before` whose workflow is not open; returns how many. */
  sweep(before: Date, openWorkflowIds: ReadonlySet<string>): Promise<number>;
  close(): Promise<void>;
}

/** An entry as peek shows it. */
export interface MemoEntryView {
  answered: boolean;
  rejected: RejectedAnswer[];
}

/** An existing entry as a claim finds it; `leaseLive` is read on the backend's clock. */
export interface EntryState {
  runId: string;
  owner: string | null;
  leaseUntil: Date | null;
  leaseLive: boolean;
  /** The stored answer (parsed JSON), or null while there is none. */
  answer: unknown;
  providerFailures: number;
  rejected: unknown;
}

/**
 * What a claim of an existing entry comes to, in both backends: its answer when it has one; `held` while
 * another owner's lease is live; else the caller takes it (it was free, expired, or already the caller's),
 * with this run's count of provider errors and refused answers (another run starts its own).
 */
export function decideClaim(entry: EntryState, request: MemoRequest, owner: string): Claim {
  const sameRun = entry.runId === request.runId;
  if (entry.answer !== null) {
    return {
      kind: 'answered',
      answer: StoredAnswerSchema.parse(entry.answer),
      rejected: sameRun ? RejectedListSchema.parse(entry.rejected) : [],
    };
  }
  if (entry.owner !== null && entry.owner !== owner && entry.leaseLive && entry.leaseUntil !== null) {
    return { kind: 'held', owner: entry.owner, leaseUntil: entry.leaseUntil };
  }
  return {
    kind: 'owned',
    providerFailures: sameRun ? entry.providerFailures : 0,
    rejected: sameRun ? RejectedListSchema.parse(entry.rejected) : [],
  };
}

/**
 * A hash of everything that shapes a model request's answer: the step, its identity (src/steps/identity.ts: the
 * model, the prompt, the answer's shape) and its input. A different request (other options, a changed step) is a
 * different key.
 */
export function memoRequestHash(parts: { step: string; identity: string; input: unknown }): string {
  return createHash('sha256').update(canonicalJson(parts)).digest('hex');
}

export function memoKeyFor(workflowId: string, step: string, requestHash: string): string {
  return `${workflowId}:${step}:${requestHash.slice(0, 32)}`;
}
