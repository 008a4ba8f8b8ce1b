import { z } from 'zod';
import { addSpent, ensureBudget } from '../model/rate-limit-store';
import type { BudgetRef } from '../model/rate-limit-store';
import { dateOf, jsonOf, safeToRepeat } from '../store/sql';
import type { Sql } from '../store/sql';
import type { BulkRequestRecord } from './types';

/** What collecting a provider batch's results came to: counts, and cost at the batch price and one by one. */
export const BulkCollectedSchema = z.object({
  answered: z.number().int().min(0),
  refused: z.number().int().min(0),
  errored: z.number().int().min(0),
  expired: z.number().int().min(0),
  canceled: z.number().int().min(0),
  inputTokens: z.number().int().min(0),
  outputTokens: z.number().int().min(0),
  /** At the batch price; null when the model has no price. */
  costUsd: z.number().min(0).nullable(),
  /** The same answers at the list price, one call each. */
  listCostUsd: z.number().min(0).nullable(),
});
export type BulkCollected = z.infer<typeof BulkCollectedSchema>;

const RequestRecordSchema = z.object({
  customId: z.string(),
  memoKey: z.string(),
  workflowId: z.string(),
  step: z.string(),
  requestHash: z.string(),
  textRef: z.string(),
  input: z.record(z.string(), z.unknown()),
  retryHint: z.string().optional(),
  identity: z.string().optional(),
  worst: z.object({ tokens: z.number(), usd: z.number() }).optional(),
});

/** A provider batch's claim as stored. */
export interface BulkClaim {
  claimKey: string;
  batchId: string;
  round: number;
  provider: string;
  requests: BulkRequestRecord[];
  /** Null until the create's answer is recorded (or a lookup found the batch an interrupted attempt made). */
  providerBatchId: string | null;
  collected: BulkCollected | null;
  claimedAt: Date;
}

/**
 * The claims of provider batches, in the memo's store (shared by the fleet like the memo). A claim names the
 * requests of one provider batch and is committed before the batch is created: an attempt that finds a claim
 * without a batch ID knows a batch may exist for it, looks for it at the provider, and creates one only when
 * none is found. The batch's ID is recorded once; a request is in one claim of a round, and a round's claims are
 * made only once the round before has ended, so a request is in at most one live provider batch.
 */
export class SqlBulkClaims {
  constructor(private readonly db: Sql) {}

  /** Makes the claim, or returns the one already made under its key (whatever requests that one holds). */
  async claim(claim: {
    claimKey: string;
    batchId: string;
    round: number;
    provider: string;
    requests: readonly BulkRequestRecord[];
  }): Promise<BulkClaim> {
    const now = this.db.now();
    // Synced: the claim must outlive the crash that may follow the create. Safe to repeat: a repeat inserts nothing.
    await this.db.run(
      safeToRepeat(
        this.db.build
          .insertInto('bulk_claims')
          .values({
            claim_key: claim.claimKey,
            batch_id: claim.batchId,
            round: claim.round,
            provider: claim.provider,
            requests: JSON.stringify(claim.requests),
            created_at: now,
            updated_at: now,
          })
          .onConflict((oc) => oc.column('claim_key').doNothing()),
      ),
    );
    const stored = await this.get(claim.claimKey);
    if (stored === undefined) throw new Error(`the bulk claim ${claim.claimKey} vanished as it was made`);
    return stored;
  }

  /** Records the provider batch of a claim; returns the one recorded (an earlier attempt's, if it recorded first). */
  async record(claimKey: string, providerBatchId: string): Promise<string> {
    await this.db.run(
      safeToRepeat(
        this.db.build
          .updateTable('bulk_claims')
          .set({ provider_batch_id: providerBatchId, updated_at: this.db.now() })
          .where('claim_key', '=', claimKey)
          .where('provider_batch_id', 'is', null),
      ),
    );
    const stored = await this.get(claimKey);
    if (stored?.providerBatchId == null)
      throw new Error(`the bulk claim ${claimKey} has no batch after recording one`);
    return stored.providerBatchId;
  }

  /**
   * Marks the claim collected, and charges what its batch cost to `budget` (the batch's, when it has one) in the
   * same transaction, once: a repeat after a crash finds it collected and charges nothing.
   */
  async collected(claimKey: string, collected: BulkCollected, budget?: BudgetRef): Promise<void> {
    await this.db.transaction(async (tx) => {
      const marked = await tx.run(
        tx.build
          .updateTable('bulk_claims')
          .set({ collected: JSON.stringify(collected), updated_at: tx.now() })
          .where('claim_key', '=', claimKey)
          .where('collected', 'is', null),
      );
      if (marked !== 1 || budget === undefined) return;
      await ensureBudget(tx, budget);
      await addSpent(tx, budget.id, {
        tokens: collected.inputTokens + collected.outputTokens,
        usd: collected.costUsd ?? 0,
      });
    });
  }

  async get(claimKey: string): Promise<BulkClaim | undefined> {
    const row = await this.db.first(this.select().where('claim_key', '=', claimKey));
    return row === undefined ? undefined : claimOf(row);
  }

  /** A batch's claims, of one round or all, in the order they were made. */
  async ofBatch(batchId: string, round?: number): Promise<BulkClaim[]> {
    const rows = await this.db.rows(
      this.select()
        .where('batch_id', '=', batchId)
        .$if(round !== undefined, (q) => q.where('round', '=', round ?? 0))
        .orderBy('round')
        .orderBy('claim_key'),
    );
    return rows.map(claimOf);
  }

  /** The provider batches some claim owns, of one provider (a lookup must not adopt another claim's batch). */
  async taken(provider: string): Promise<Set<string>> {
    const rows = await this.db.rows(
      this.db.build
        .selectFrom('bulk_claims')
        .select('provider_batch_id')
        .where('provider', '=', provider)
        .where('provider_batch_id', 'is not', null),
    );
    return new Set(rows.flatMap((r) => (r.provider_batch_id === null ? [] : [r.provider_batch_id])));
  }

  private select() {
    return this.db.build
      .selectFrom('bulk_claims')
      .select([
        'claim_key',
        'batch_id',
        'round',
        'provider',
        'requests',
        'provider_batch_id',
        'collected',
        'created_at',
      ]);
  }
}

function claimOf(row: {
  claim_key: string;
  batch_id: string;
  round: number;
  provider: string;
  requests: unknown;
  provider_batch_id: string | null;
  collected: unknown;
  created_at: Date | number | string;
}): BulkClaim {
  return {
    claimKey: row.claim_key,
    batchId: row.batch_id,
    round: Number(row.round),
    provider: row.provider,
    requests: z.array(RequestRecordSchema).parse(jsonOf(row.requests)),
    providerBatchId: row.provider_batch_id,
    collected: row.collected === null ? null : BulkCollectedSchema.parse(jsonOf(row.collected)),
    claimedAt: dateOf(row.created_at),
  };
}
