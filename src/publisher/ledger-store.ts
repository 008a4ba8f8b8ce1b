import { sql } from 'kysely';
import { openSqlite } from '../store/sql-sqlite';
import { clockMs } from '../store/clock';
import { forUpdate, sweepClosedWorkflows } from '../store/sql';
import type { Sql } from '../store/sql';
import { claimFromRow, ENTRY_COLUMNS, ledgerEntry } from './ledger';
import type { ClaimSeen, Delivery, DeliveryLedger, LedgerClaim, LedgerEntry } from './ledger';
import type { Receipt } from './types';

/** The columns of an entry, for the claim's templates. */
const ENTRY = sql.raw(ENTRY_COLUMNS.join(', '));

/** The delivery ledger in either backend: the SQLite file of one machine, or PostgreSQL for a fleet. */
export class SqlDeliveryLedger implements DeliveryLedger {
  constructor(private readonly db: Sql) {}

  async claim(delivery: Delivery, owner: string): Promise<LedgerClaim> {
    return this.db.transaction(async (tx): Promise<LedgerClaim> => {
      const { idempotencyKey: key, documentId, version } = delivery;
      const now = tx.now();
      // The row is made first (unsent, nothing sent yet), so what this delivery learns later has a row to go to.
      await tx.run(
        sql`INSERT INTO delivery_ledger (idempotency_key, workflow_id, document_id, text_ref, scheduled_at, state,
          attempts, created_at, updated_at) VALUES (${key}, ${delivery.workflowId}, ${documentId}, ${version},
          ${delivery.scheduledAt ?? null}, 'unsent', 0, ${now}, ${now}) ON CONFLICT (idempotency_key) DO NOTHING`,
      );
      // Locked until commit (FOR UPDATE, or SQLite's write lock): claimers of one key take turns from here.
      const found = await tx.first(
        sql`SELECT ${ENTRY} FROM delivery_ledger WHERE idempotency_key = ${key}${forUpdate(tx)}`,
      );
      const nowMs = await clockMs(tx);
      const claim = claimFromRow(found, owner, nowMs);
      if (claim !== 'take') return claim;
      // An earlier run's open claim on this same version is this delivery's too, unless it is still its own
      // attempt's to settle (its POST may be under way), or another version of the document was claimed or
      // delivered by a later run: then the file moved on (an edit, then a revert), and what was sent then is not
      // what the receiver shows now. Runs are ordered by their publications' scheduledAt where both rows have one
      // (a stale run that publishes late supersedes nothing), else by when their rows were made.
      const earlier = await tx.first(
        sql`SELECT ${ENTRY} FROM delivery_ledger AS open WHERE document_id = ${documentId} AND text_ref = ${version}
          AND state = 'claimed' AND idempotency_key <> ${key}
          AND (last_error IS NOT NULL OR updated_at <= ${tx.ago(delivery.inFlightMs)})
          AND NOT EXISTS (SELECT 1 FROM delivery_ledger AS newer WHERE newer.document_id = ${documentId}
            AND newer.text_ref <> ${version} AND newer.state IN ('claimed', 'delivered')
            AND CASE WHEN newer.scheduled_at IS NOT NULL AND open.scheduled_at IS NOT NULL
              THEN newer.scheduled_at > open.scheduled_at ELSE newer.created_at > open.created_at END)
          ORDER BY updated_at LIMIT 1`,
      );
      if (earlier !== undefined) return { kind: 'open', entry: ledgerEntry(earlier, nowMs) };
      await tx.run(
        sql`UPDATE delivery_ledger SET state = 'claimed', owner = ${owner}, text_ref = ${version},
          attempts = attempts + 1, last_error = NULL, updated_at = ${now} WHERE idempotency_key = ${key}`,
      );
      return { kind: 'fresh' };
    });
  }

  async retake(seen: ClaimSeen, owner: string): Promise<boolean> {
    const changed = await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set((eb) => ({
          owner,
          attempts: eb('attempts', '+', 1),
          last_error: null,
          updated_at: this.db.now(),
        }))
        .where('idempotency_key', '=', seen.idempotencyKey)
        .where('state', '=', 'claimed')
        .where('owner', seen.owner === null ? 'is' : '=', seen.owner)
        .where('attempts', '=', seen.attempts),
    );
    return changed === 1;
  }

  async delivered(
    idempotencyKey: string,
    owner: string,
    receipt: Receipt,
    echoedBy: string | undefined,
  ): Promise<void> {
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
        .where('idempotency_key', '=', idempotencyKey)
        .where('state', '=', 'claimed')
        .where('owner', '=', owner),
    );
  }

  async deliveredAs(idempotencyKey: string, receipt: Receipt): Promise<void> {
    await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set({ state: 'delivered', receipt: JSON.stringify(receipt), updated_at: this.db.now() })
        .where('idempotency_key', '=', idempotencyKey)
        .where('state', '<>', 'delivered'),
    );
  }

  async note(idempotencyKey: string, owner: string, error: string): Promise<void> {
    await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set({ last_error: error, updated_at: this.db.now() })
        .where('idempotency_key', '=', idempotencyKey)
        .where('state', '=', 'claimed')
        .where('owner', '=', owner),
    );
  }

  async unsent(idempotencyKey: string, owner: string, error: string): Promise<void> {
    await this.db.run(
      this.db.build
        .updateTable('delivery_ledger')
        .set({ state: 'unsent', last_error: error, updated_at: this.db.now() })
        .where('idempotency_key', '=', idempotencyKey)
        .where('state', '=', 'claimed')
        .where('owner', '=', owner),
    );
  }

  async openClaims(): Promise<LedgerEntry[]> {
    const nowMs = await clockMs(this.db);
    const rows = await this.db.rows(
      this.db.build
        .selectFrom('delivery_ledger')
        .select(ENTRY_COLUMNS)
        .where('state', '=', 'claimed')
        .orderBy('updated_at'),
    );
    return rows.map((row) => ledgerEntry(row, nowMs));
  }

  async resolve(seen: ClaimSeen, verdict: { delivered: Receipt } | 'unsent'): Promise<boolean> {
    return this.db.transaction(async (tx) => {
      const key = seen.idempotencyKey;
      const changed = await tx.run(
        tx.build
          .updateTable('delivery_ledger')
          .set(
            verdict === 'unsent'
              ? { state: 'unsent', last_error: 'resolved: not delivered', updated_at: tx.now() }
              : { state: 'delivered', receipt: JSON.stringify(verdict.delivered), updated_at: tx.now() },
          )
          .where('idempotency_key', '=', key)
          .where('state', '=', 'claimed')
          .where('owner', seen.owner === null ? 'is' : '=', seen.owner)
          .where('attempts', '=', seen.attempts),
      );
      if (changed !== 1) return false;
      if (verdict !== 'unsent') {
        // The later runs held on this claim (the same version, never sent under their own keys) are delivered by
        // it too: settled with it, so none of them sends the version again under its own key.
        await tx.run(
          sql`UPDATE delivery_ledger SET state = 'delivered', receipt = ${JSON.stringify(verdict.delivered)},
            updated_at = ${tx.now()} WHERE state = 'unsent' AND attempts = 0 AND idempotency_key <> ${key}
            AND (document_id, text_ref) = (SELECT document_id, text_ref FROM delivery_ledger
              WHERE idempotency_key = ${key})`,
        );
      }
      return true;
    });
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
