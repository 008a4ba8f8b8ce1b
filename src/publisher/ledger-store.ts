import { openSqlite } from '../store/sql-sqlite';
import { sweepClosedWorkflows } from '../store/sql';
import type { Sql } from '../store/sql';
import { claimFromRow, ENTRY_COLUMNS, ledgerEntry } from './ledger';
import type { Delivery, DeliveryLedger, LedgerClaim, LedgerEntry } from './ledger';
import type { Receipt } from './types';

/** The delivery ledger in either backend: the SQLite file of one machine, or PostgreSQL for a fleet. */
export class SqlDeliveryLedger implements DeliveryLedger {
  constructor(private readonly db: Sql) {}

  async claim(delivery: Delivery, owner: string): Promise<LedgerClaim> {
    return this.db.transaction(async (tx): Promise<LedgerClaim> => {
      const entries = tx.build.selectFrom('delivery_ledger').select(ENTRY_COLUMNS);
      // The row is made first (unsent, nothing sent yet), so what this delivery learns later has a row to go to.
      await tx.run(
        tx.build
          .insertInto('delivery_ledger')
          .values({
            idempotency_key: delivery.idempotencyKey,
            workflow_id: delivery.workflowId,
            document_id: delivery.documentId,
            text_ref: delivery.version,
            state: 'unsent',
            attempts: 0,
            created_at: tx.now(),
            updated_at: tx.now(),
          })
          .onConflict((conflict) => conflict.column('idempotency_key').doNothing()),
      );
      // Locked until commit (FOR UPDATE, or SQLite's write lock): claimers of one key take turns from here.
      const found = await tx.first(
        entries.where('idempotency_key', '=', delivery.idempotencyKey).$if(tx.lockRows, (q) => q.forUpdate()),
      );
      const claim = claimFromRow(found, owner);
      if (claim !== 'take') return claim;
      const earlier = await tx.first(
        entries
          .where('document_id', '=', delivery.documentId)
          .where('text_ref', '=', delivery.version)
          .where('state', '=', 'claimed')
          .where('idempotency_key', '<>', delivery.idempotencyKey)
          .where((eb) =>
            eb.or([eb('last_error', 'is not', null), eb('updated_at', '<=', tx.ago(delivery.inFlightMs))]),
          )
          .orderBy('updated_at')
          .limit(1),
      );
      if (earlier !== undefined) return { kind: 'open', entry: ledgerEntry(earlier) };
      await tx.run(
        tx.build
          .updateTable('delivery_ledger')
          .set((eb) => ({
            state: 'claimed',
            owner,
            text_ref: delivery.version,
            attempts: eb('attempts', '+', 1),
            updated_at: tx.now(),
          }))
          .where('idempotency_key', '=', delivery.idempotencyKey),
      );
      return { kind: 'fresh' };
    });
  }

  async retake(idempotencyKey: string, owner: string): Promise<void> {
    await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set((eb) => ({
          owner,
          attempts: eb('attempts', '+', 1),
          last_error: null,
          updated_at: this.db.now(),
        }))
        .where('idempotency_key', '=', idempotencyKey)
        .where('state', '=', 'claimed'),
    );
  }

  async delivered(idempotencyKey: string, receipt: Receipt, echoedBy: string | undefined): Promise<void> {
    await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set({
          state: 'delivered',
          receipt: JSON.stringify(receipt),
          receiver_echoed_key: echoedBy !== undefined,
          echoed_by: echoedBy ?? null,
          last_error: null,
          updated_at: this.db.now(),
        })
        .where('idempotency_key', '=', idempotencyKey),
    );
  }

  async note(idempotencyKey: string, error: string): Promise<void> {
    await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set({ last_error: error, updated_at: this.db.now() })
        .where('idempotency_key', '=', idempotencyKey)
        .where('state', '=', 'claimed'),
    );
  }

  async unsent(idempotencyKey: string, error: string): Promise<void> {
    await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set({ state: 'unsent', last_error: error, updated_at: this.db.now() })
        .where('idempotency_key', '=', idempotencyKey)
        .where('state', '=', 'claimed'),
    );
  }

  async openClaims(): Promise<LedgerEntry[]> {
    const rows = await this.db.rows(
      this.db.build
        .selectFrom('delivery_ledger')
        .select(ENTRY_COLUMNS)
        .where('state', '=', 'claimed')
        .orderBy('updated_at'),
    );
    return rows.map(ledgerEntry);
  }

  async resolve(idempotencyKey: string, verdict: { delivered: Receipt } | 'unsent'): Promise<boolean> {
    const changed = await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set(
          verdict === 'unsent'
            ? {
                state: 'unsent',
                last_error: 'resolved by an operator: not delivered',
                updated_at: this.db.now(),
              }
            : { state: 'delivered', receipt: JSON.stringify(verdict.delivered), updated_at: this.db.now() },
        )
        .where('idempotency_key', '=', idempotencyKey)
        .where('state', '=', 'claimed'),
    );
    return changed === 1;
  }

  async receiverHonoursKeys(origin: string): Promise<boolean> {
    const row = await this.db.first(
      this.db.build
        .selectFrom('delivery_ledger')
        .select('idempotency_key')
        .where('receiver_echoed_key', '=', true)
        .where('echoed_by', '=', origin)
        .limit(1),
    );
    return row !== undefined;
  }

  async sweep(before: Date, openWorkflowIds: ReadonlySet<string>): Promise<number> {
    // Settled deliveries only: an open claim is an operator's to resolve, however old.
    const old = this.db.time(before);
    const settled = this.db.build.selectFrom('delivery_ledger').where('state', '<>', 'claimed');
    return sweepClosedWorkflows(
      this.db,
      openWorkflowIds,
      settled.select(['idempotency_key as key', 'workflow_id']).where('updated_at', '<', old),
      (keys) =>
        this.db.build
          .deleteFrom('delivery_ledger')
          .where('idempotency_key', 'in', keys)
          .where('state', '<>', 'claimed')
          .where('updated_at', '<', old),
    );
  }

  close(): Promise<void> {
    return this.db.close();
  }
}

/** The ledger in the embedded SQLite file of one machine (the default without DATABASE_URL). */
export class SqliteDeliveryLedger extends SqlDeliveryLedger {
  constructor(file: string) {
    super(openSqlite(file, 'ledger'));
  }
}
