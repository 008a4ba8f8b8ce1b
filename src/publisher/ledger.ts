import { z } from 'zod';
import type { Receipt } from './types';

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
  /** Takes an open claim over, to POST again (the receiver dedupes, or an operator said it never arrived). */
  retake(idempotencyKey: string, owner: string): Promise<void>;
  /**
   * Records the receiver's receipt and, when it echoed the key (a receiver that honours keys does), the origin
   * that did: what a receiver has shown belongs to that receiver.
   */
  delivered(idempotencyKey: string, receipt: Receipt, echoedBy: string | undefined): Promise<void>;
  /** Records an answer that proved nothing (a 5xx, a 429) on a claim that stays open, for the operator to see. */
  note(idempotencyKey: string, error: string): Promise<void>;
  /** Records that the attempt provably did not land (the receiver refused the connection or answered an error). */
  unsent(idempotencyKey: string, error: string): Promise<void>;
  /** Claims left open: deliveries nobody knows the fate of, for an operator to reconcile. */
  openClaims(): Promise<LedgerEntry[]>;
  /** An operator's verdict on an open claim after checking the receiver; false when the key has no open claim. */
  resolve(idempotencyKey: string, verdict: { delivered: Receipt } | 'unsent'): Promise<boolean>;
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
] as const;

/** A ledger row as an entry; both backends store the same columns. */
export function ledgerEntry(row: unknown): LedgerEntry {
  const r = RowSchema.parse(row);
  return {
    idempotencyKey: r.idempotency_key,
    workflowId: r.workflow_id,
    documentId: r.document_id,
    state: r.state,
    owner: r.owner,
    attempts: r.attempts,
    lastError: r.last_error,
    updatedAt: r.updated_at instanceof Date ? r.updated_at : new Date(r.updated_at),
  };
}

/**
 * What a claim finds, from the row the key has (if any); both backends decide here. A row claimed by `owner`
 * itself is this attempt's own claim, whose COMMIT went unanswered and was repeated: nothing was sent under it.
 */
export function claimFromRow(row: unknown, owner: string): LedgerClaim | 'take' {
  if (row === undefined) return 'take';
  const r: Row = RowSchema.parse(row);
  if (r.state === 'delivered') {
    const receipt = typeof r.receipt === 'string' ? (JSON.parse(r.receipt) as unknown) : r.receipt;
    return { kind: 'delivered', receipt: ReceiptRecordSchema.parse(receipt) };
  }
  if (r.state === 'unsent' || r.owner === owner) return 'take';
  return { kind: 'open', entry: ledgerEntry(row) };
}
