import type Database from 'better-sqlite3';
import { z } from 'zod';
import { openDatabase } from '../lib/sqlite';
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

const COLUMNS =
  'idempotency_key, workflow_id, document_id, state, owner, attempts, receipt, last_error, updated_at';

/** The ledger in the embedded SQLite file of one machine (the default without DATABASE_URL). */
export class SqliteDeliveryLedger implements DeliveryLedger {
  private readonly db: Database.Database;

  constructor(file: string) {
    this.db = openDatabase(file);
    this.db.exec(`CREATE TABLE IF NOT EXISTS delivery_ledger (
      idempotency_key TEXT PRIMARY KEY,
      workflow_id TEXT NOT NULL,
      document_id TEXT NOT NULL,
      state TEXT NOT NULL,
      owner TEXT,
      attempts INTEGER NOT NULL DEFAULT 0,
      receipt TEXT,
      receiver_echoed_key INTEGER,
      echoed_by TEXT,
      text_ref TEXT,
      last_error TEXT,
      created_at INTEGER NOT NULL,
      updated_at INTEGER NOT NULL
    )`);
    // Files made before the echo was recorded per receiver (their echoes name no receiver, so none is trusted) and
    // before deliveries knew their version (their claims match no other run's).
    const addColumns = this.db.transaction(() => {
      const columns = z
        .array(z.object({ name: z.string() }))
        .parse(this.db.pragma('table_info(delivery_ledger)'));
      for (const column of ['echoed_by', 'text_ref']) {
        if (!columns.some((c) => c.name === column))
          this.db.exec(`ALTER TABLE delivery_ledger ADD COLUMN ${column} TEXT`);
      }
    });
    addColumns.immediate();
  }

  async claim(delivery: Delivery, owner: string): Promise<LedgerClaim> {
    const now = Date.now();
    const run = this.db.transaction((): LedgerClaim => {
      // The row is made first (unsent, nothing sent yet), so what this delivery learns later has a row to go to.
      this.db
        .prepare(
          `INSERT INTO delivery_ledger (idempotency_key, workflow_id, document_id, text_ref, state, attempts,
             created_at, updated_at) VALUES (?, ?, ?, ?, 'unsent', 0, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING`,
        )
        .run(delivery.idempotencyKey, delivery.workflowId, delivery.documentId, delivery.version, now, now);
      const found = this.db
        .prepare(`SELECT ${COLUMNS} FROM delivery_ledger WHERE idempotency_key = ?`)
        .get(delivery.idempotencyKey);
      const claim = claimFromRow(found, owner);
      if (claim !== 'take') return claim;
      const earlier = this.db
        .prepare(
          `SELECT ${COLUMNS} FROM delivery_ledger WHERE document_id = ? AND text_ref = ? AND state = 'claimed'
             AND idempotency_key <> ? AND (last_error IS NOT NULL OR updated_at <= ?) ORDER BY updated_at LIMIT 1`,
        )
        .get(delivery.documentId, delivery.version, delivery.idempotencyKey, now - delivery.inFlightMs);
      if (earlier !== undefined) return { kind: 'open', entry: ledgerEntry(earlier) };
      this.db
        .prepare(
          `UPDATE delivery_ledger SET state = 'claimed', owner = ?, text_ref = ?, attempts = attempts + 1,
             updated_at = ? WHERE idempotency_key = ?`,
        )
        .run(owner, delivery.version, now, delivery.idempotencyKey);
      return { kind: 'fresh' };
    });
    return run.immediate();
  }

  async retake(idempotencyKey: string, owner: string): Promise<void> {
    this.db
      .prepare(
        `UPDATE delivery_ledger SET owner = ?, attempts = attempts + 1, last_error = NULL, updated_at = ?
         WHERE idempotency_key = ? AND state = 'claimed'`,
      )
      .run(owner, Date.now(), idempotencyKey);
    return;
  }

  async delivered(idempotencyKey: string, receipt: Receipt, echoedBy: string | undefined): Promise<void> {
    this.db
      .prepare(
        `UPDATE delivery_ledger SET state = 'delivered', receipt = ?, receiver_echoed_key = ?, echoed_by = ?,
           last_error = NULL, updated_at = ? WHERE idempotency_key = ?`,
      )
      .run(
        JSON.stringify(receipt),
        echoedBy !== undefined ? 1 : 0,
        echoedBy ?? null,
        Date.now(),
        idempotencyKey,
      );
    return;
  }

  async note(idempotencyKey: string, error: string): Promise<void> {
    this.db
      .prepare(
        `UPDATE delivery_ledger SET last_error = ?, updated_at = ? WHERE idempotency_key = ? AND state = 'claimed'`,
      )
      .run(error, Date.now(), idempotencyKey);
  }

  async unsent(idempotencyKey: string, error: string): Promise<void> {
    this.db
      .prepare(
        `UPDATE delivery_ledger SET state = 'unsent', last_error = ?, updated_at = ?
         WHERE idempotency_key = ? AND state = 'claimed'`,
      )
      .run(error, Date.now(), idempotencyKey);
    return;
  }

  async openClaims(): Promise<LedgerEntry[]> {
    const rows = this.db
      .prepare(`SELECT ${COLUMNS} FROM delivery_ledger WHERE state = 'claimed' ORDER BY updated_at`)
      .all();
    return rows.map(ledgerEntry);
  }

  async resolve(idempotencyKey: string, verdict: { delivered: Receipt } | 'unsent'): Promise<boolean> {
    const result =
      verdict === 'unsent'
        ? this.db
            .prepare(
              `UPDATE delivery_ledger SET state = 'unsent', last_error = 'resolved by an operator: not delivered',
                 updated_at = ? WHERE idempotency_key = ? AND state = 'claimed'`,
            )
            .run(Date.now(), idempotencyKey)
        : this.db
            .prepare(
              `UPDATE delivery_ledger SET state = 'delivered', receipt = ?, updated_at = ?
               WHERE idempotency_key = ? AND state = 'claimed'`,
            )
            .run(JSON.stringify(verdict.delivered), Date.now(), idempotencyKey);
    return result.changes === 1;
  }

  async receiverHonoursKeys(origin: string): Promise<boolean> {
    const row = this.db
      .prepare('SELECT 1 AS yes FROM delivery_ledger WHERE receiver_echoed_key = 1 AND echoed_by = ? LIMIT 1')
      .get(origin);
    return row !== undefined;
  }

  async sweep(before: Date, openWorkflowIds: ReadonlySet<string>): Promise<number> {
    const run = this.db.transaction((): number => {
      const rows = z
        .array(z.object({ idempotency_key: z.string(), workflow_id: z.string() }))
        .parse(
          this.db
            .prepare(
              `SELECT idempotency_key, workflow_id FROM delivery_ledger WHERE state <> 'claimed' AND updated_at < ?`,
            )
            .all(before.getTime()),
        );
      const remove = this.db.prepare('DELETE FROM delivery_ledger WHERE idempotency_key = ?');
      let removed = 0;
      for (const row of rows) {
        if (!openWorkflowIds.has(row.workflow_id)) removed += remove.run(row.idempotency_key).changes;
      }
      return removed;
    });
    return run.immediate();
  }

  async close(): Promise<void> {
    this.db.close();
    return;
  }
}
