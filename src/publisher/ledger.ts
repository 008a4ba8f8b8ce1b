import { z } from 'zod';
import type { Receipt } from './types';

/**
 * How long a claim's POST may be under way, or still be processed by the receiver, after it was sent: its request
 * timeout and a grace (a slow network, a busy worker, an origin still working behind a gateway that gave up). Both
 * the publisher, before it believes "not there", and the operator's command judge an open claim by it.
 */
export function inFlightMs(requestTimeoutMs: number): number {
  return requestTimeoutMs + 5_000;
}

export const LEDGER_STATES = ['claimed', 'delivered', 'unsent'] as const;

/** One delivery in the ledger: what the listing command shows. */
export interface LedgerEntry {
  idempotencyKey: string;
  workflowId: string;
  documentId: string;
  /** `claimed`: a POST may be under way or may have landed unanswered; `unsent`: provably not delivered. */
  state: (typeof LEDGER_STATES)[number];
  owner: string | null;
  attempts: number;
  lastError: string | null;
  updatedAt: Date;
  /** The document version it publishes; null for claims from before versions were recorded (migration 3). */
  version: string | null;
  /**
   * How long ago it was last claimed, sent or noted, by the store's clock (read with the entry): what "may its
   * POST still be under way" is judged by, never a worker's or an operator's own clock.
   */
  ageMs: number;
}

/** Whose claim a transition acts on: the key, and the claim as it was seen (its owner and attempt). */
export interface ClaimSeen {
  idempotencyKey: string;
  owner: string | null;
  attempts: number;
}

export type LedgerClaim =
  /** Nothing was sent under this key, or what was sent provably did not land: the caller owns it and may POST. */
  | { kind: 'fresh' }
  /** The receiver answered before: its receipt, so nobody POSTs again. */
  | { kind: 'delivered'; receipt: Receipt }
  /**
   * An earlier attempt POSTed and never recorded an answer (it crashed, stalled or lost the reply): an attempt
   * under this key, or a run before this one that sent the same version of the document under its own key (a
   * resubmission after a failed run, a reset). `entry` says which.
   */
  | { kind: 'open'; entry: LedgerEntry };

/** One delivery to claim: its key, and the document and version it publishes. */
export interface Delivery {
  idempotencyKey: string;
  workflowId: string;
  documentId: string;
  /** The version published (the text's reference): another run's open claim on it is this delivery's too. */
  version: string;
  /**
   * The publication's scheduledAt: the order of the document's runs. A claim or delivery of another version from a
   * later run supersedes this one's open claim, and not one from an earlier run (a stale run publishing late).
   */
  scheduledAt?: number | undefined;
  /**
   * How long another run's claim may still have its POST under way (the request timeout and a grace), unless its
   * attempt already said it ended unanswered: such a claim is its own attempt's to settle (a run a reset replaced,
   * still sending; the receiver orders the two), not one this delivery inherits.
   */
  inFlightMs: number;
}

export const ReceiptRecordSchema = z.object({
  documentId: z.string(),
  revision: z.number().int().min(1),
  duplicate: z.boolean(),
  superseded: z.boolean().optional(),
});

/**
 * The record of webhook deliveries, written before the effect: claim, then POST, then record the receipt. A retry
 * that finds a receipt answers from it; one that finds a claim without a receipt knows a POST may have landed and
 * follows the configured policy instead of POSTing blindly (see WebhookPublisher).
 */
export interface DeliveryLedger {
  claim(delivery: Delivery, owner: string): Promise<LedgerClaim>;
  /**
   * Takes an open claim over, to POST again (the receiver dedupes, or an operator said it never arrived), if it is
   * still the claim that was seen: false when it moved on meanwhile (another attempt took it, or it settled).
   */
  retake(seen: ClaimSeen, owner: string): Promise<boolean>;
  /**
   * Records the receiver's receipt for `owner`'s claim and, when it echoed the key (a receiver that honours keys
   * does), the origin that did: what a receiver has shown belongs to that receiver. A claim that moved on to
   * another owner is left alone (a stalled attempt's late answer).
   */
  delivered(
    idempotencyKey: string,
    owner: string,
    receipt: Receipt,
    echoedBy: string | undefined,
  ): Promise<void>;
  /**
   * Records that this run's own delivery is the one an earlier run's claim delivered (the same document version):
   * its row settles with that receipt, and nothing is sent under its key.
   */
  deliveredAs(idempotencyKey: string, receipt: Receipt): Promise<void>;
  /** Records an answer that proved nothing (a 5xx, a 429, a redirect) on `owner`'s claim, which stays open. */
  note(idempotencyKey: string, owner: string, error: string): Promise<void>;
  /** Records that `owner`'s attempt provably did not land (the connection was refused, or a 4xx refusal). */
  unsent(idempotencyKey: string, owner: string, error: string): Promise<void>;
  /** Claims left open: deliveries nobody knows the fate of, for an operator to reconcile. */
  openClaims(): Promise<LedgerEntry[]>;
  /**
   * A verdict on an open claim (an operator's after checking the receiver, or the receiver's lookup), if it is
   * still the claim that was seen. A "delivered" verdict settles with it the rows of later runs that were held on
   * it (the same document version, never sent themselves). False when the claim moved on or settled meanwhile.
   */
  resolve(seen: ClaimSeen, verdict: { delivered: Receipt } | 'unsent'): Promise<boolean>;
  /**
   * True once the receiver at `origin` has echoed an Idempotency-Key: it dedupes, so re-sending an open claim to
   * it is safe. Another receiver's echo says nothing about this one.
   */
  receiverHonoursKeys(origin: string): Promise<boolean>;
  /** Deletes settled entries untouched since `before` whose workflow is not open; returns how many. */
  sweep(before: Date, openWorkflowIds: ReadonlySet<string>): Promise<number>;
  close(): Promise<void>;
}

const RowSchema = z.object({
  idempotency_key: z.string(),
  workflow_id: z.string(),
  document_id: z.string(),
  state: z.enum(LEDGER_STATES),
  owner: z.string().nullable(),
  attempts: z.number(),
  receipt: z.unknown(),
  last_error: z.string().nullable(),
  updated_at: z.union([z.number(), z.date()]),
  text_ref: z.string().nullable(),
});
type Row = z.infer<typeof RowSchema>;

/** The columns a ledger entry is read from. */
export const ENTRY_COLUMNS = [
  'idempotency_key',
  'workflow_id',
  'document_id',
  'state',
  'owner',
  'attempts',
  'receipt',
  'last_error',
  'updated_at',
  'text_ref',
] as const;

/** A ledger row as an entry, read when the store's clock said `nowMs`; both backends store the same columns. */
export function ledgerEntry(row: unknown, nowMs: number): LedgerEntry {
  const r = RowSchema.parse(row);
  const updatedAt = r.updated_at instanceof Date ? r.updated_at : new Date(r.updated_at);
  return {
    idempotencyKey: r.idempotency_key,
    workflowId: r.workflow_id,
    documentId: r.document_id,
    state: r.state,
    owner: r.owner,
    attempts: r.attempts,
    lastError: r.last_error,
    updatedAt,
    version: r.text_ref,
    ageMs: Math.max(0, nowMs - updatedAt.getTime()),
  };
}

/**
 * What a claim finds, from the row the key has (if any); both backends decide here. A row claimed by `owner`
 * itself is this attempt's own claim, whose COMMIT went unanswered and was repeated: nothing was sent under it.
 */
export function claimFromRow(row: unknown, owner: string, nowMs: number): LedgerClaim | 'take' {
  if (row === undefined) return 'take';
  const r: Row = RowSchema.parse(row);
  if (r.state === 'delivered') {
    const receipt = typeof r.receipt === 'string' ? (JSON.parse(r.receipt) as unknown) : r.receipt;
    return { kind: 'delivered', receipt: ReceiptRecordSchema.parse(receipt) };
  }
  if (r.state === 'unsent' || r.owner === owner) return 'take';
  return { kind: 'open', entry: ledgerEntry(row, nowMs) };
}
