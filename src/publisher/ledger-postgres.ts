import type { Pool } from '../lib/postgres';
import { claimFromRow, ledgerEntry } from './ledger';
import type { Delivery, DeliveryLedger, LedgerClaim, LedgerEntry } from './ledger';
import type { Receipt } from './types';

const COLUMNS =
  'idempotency_key, workflow_id, document_id, state, owner, attempts, receipt, last_error, updated_at';

/** The delivery ledger in PostgreSQL, shared by every worker of the fleet. */
export class PostgresDeliveryLedger implements DeliveryLedger {
  constructor(private readonly pool: Pool) {}

  async claim(delivery: Delivery, owner: string): Promise<LedgerClaim> {
    return this.pool.transaction(async (db): Promise<LedgerClaim> => {
      await db.query(
        `INSERT INTO delivery_ledger (idempotency_key, workflow_id, document_id, text_ref, state, attempts)
         VALUES ($1, $2, $3, $4, 'unsent', 0) ON CONFLICT (idempotency_key) DO NOTHING`,
        [delivery.idempotencyKey, delivery.workflowId, delivery.documentId, delivery.version],
      );
      const found = await db.query(
        `SELECT ${COLUMNS} FROM delivery_ledger WHERE idempotency_key = $1 FOR UPDATE`,
        [delivery.idempotencyKey],
      );
      const claim = claimFromRow(found.rows[0], owner);
      if (claim !== 'take') return claim;
      const earlier = await db.query(
        `SELECT ${COLUMNS} FROM delivery_ledger WHERE document_id = $1 AND text_ref = $2 AND state = 'claimed'
           AND idempotency_key <> $3
           AND (last_error IS NOT NULL OR updated_at <= now() - $4 * interval '1 millisecond')
         ORDER BY updated_at LIMIT 1`,
        [delivery.documentId, delivery.version, delivery.idempotencyKey, delivery.inFlightMs],
      );
      if (earlier.rows[0] !== undefined) return { kind: 'open', entry: ledgerEntry(earlier.rows[0]) };
      await db.query(
        `UPDATE delivery_ledger SET state = 'claimed', owner = $2, text_ref = $3, attempts = attempts + 1,
           updated_at = now() WHERE idempotency_key = $1`,
        [delivery.idempotencyKey, owner, delivery.version],
      );
      return { kind: 'fresh' };
    });
  }

  async retake(idempotencyKey: string, owner: string): Promise<void> {
    await this.pool.query(
      `UPDATE delivery_ledger SET owner = $2, attempts = attempts + 1, last_error = NULL, updated_at = now()
       WHERE idempotency_key = $1 AND state = 'claimed'`,
      [idempotencyKey, owner],
    );
  }

  async delivered(idempotencyKey: string, receipt: Receipt, echoedBy: string | undefined): Promise<void> {
    await this.pool.query(
      `UPDATE delivery_ledger SET state = 'delivered', receipt = $2, receiver_echoed_key = $3, echoed_by = $4,
         last_error = NULL, updated_at = now() WHERE idempotency_key = $1`,
      [idempotencyKey, JSON.stringify(receipt), echoedBy !== undefined, echoedBy ?? null],
    );
  }

  async note(idempotencyKey: string, error: string): Promise<void> {
    await this.pool.query(
      `UPDATE delivery_ledger SET last_error = $2, updated_at = now() WHERE idempotency_key = $1 AND state = 'claimed'`,
      [idempotencyKey, error],
    );
  }

  async unsent(idempotencyKey: string, error: string): Promise<void> {
    await this.pool.query(
      `UPDATE delivery_ledger SET state = 'unsent', last_error = $2, updated_at = now()
       WHERE idempotency_key = $1 AND state = 'claimed'`,
      [idempotencyKey, error],
    );
  }

  async openClaims(): Promise<LedgerEntry[]> {
    const result = await this.pool.query(
      `SELECT ${COLUMNS} FROM delivery_ledger WHERE state = 'claimed' ORDER BY updated_at`,
    );
    return result.rows.map(ledgerEntry);
  }

  async resolve(idempotencyKey: string, verdict: { delivered: Receipt } | 'unsent'): Promise<boolean> {
    const result =
      verdict === 'unsent'
        ? await this.pool.query(
            `UPDATE delivery_ledger SET state = 'unsent', last_error = 'resolved by an operator: not delivered',
               updated_at = now() WHERE idempotency_key = $1 AND state = 'claimed'`,
            [idempotencyKey],
          )
        : await this.pool.query(
            `UPDATE delivery_ledger SET state = 'delivered', receipt = $2, updated_at = now()
             WHERE idempotency_key = $1 AND state = 'claimed'`,
            [idempotencyKey, JSON.stringify(verdict.delivered)],
          );
    return result.rowCount === 1;
  }

  async receiverHonoursKeys(origin: string): Promise<boolean> {
    const result = await this.pool.query(
      'SELECT 1 FROM delivery_ledger WHERE receiver_echoed_key AND echoed_by = $1 LIMIT 1',
      [origin],
    );
    return result.rows.length > 0;
  }

  async sweep(before: Date, openWorkflowIds: ReadonlySet<string>): Promise<number> {
    const result = await this.pool.query(
      `DELETE FROM delivery_ledger WHERE state <> 'claimed' AND updated_at < $1
         AND NOT (workflow_id = ANY($2::text[]))`,
      [before, [...openWorkflowIds]],
    );
    return result.rowCount ?? 0;
  }

  async close(): Promise<void> {
    return;
  }
}
