import { z } from 'zod';
import type { Pool } from '../lib/postgres';
import { decideClaim, StoredAnswerSchema } from './memo';
import type { AnswerMemo, Claim, MemoRequest, Release, StoredAnswer } from './memo';

const RowSchema = z.object({
  run_id: z.string(),
  owner: z.string().nullable(),
  lease_until: z.date().nullable(),
  lease_live: z.boolean().nullable(),
  answer: z.unknown(),
  provider_failures: z.number(),
  rejected: z.unknown(),
});

/**
 * The memo in PostgreSQL, shared by workers on any number of hosts. Leases are read against the database's clock,
 * so hosts whose clocks disagree still agree on whose claim is live.
 */
export class PostgresAnswerMemo implements AnswerMemo {
  constructor(private readonly pool: Pool) {}

  async claim(request: MemoRequest, owner: string, leaseMs: number): Promise<Claim> {
    return this.pool.transaction(async (db): Promise<Claim> => {
      // Creates the row if missing, then locks it: concurrent claimers of one key take turns from here.
      await db.query(
        `INSERT INTO model_memo (memo_key, workflow_id, step, request_hash, run_id)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (memo_key) DO NOTHING`,
        [request.memoKey, request.workflowId, request.step, request.requestHash, request.runId],
      );
      const found = RowSchema.parse(
        (
          await db.query(
            `SELECT run_id, owner, lease_until, lease_until > clock_timestamp() AS lease_live, answer,
               provider_failures, rejected FROM model_memo WHERE memo_key = $1 FOR UPDATE`,
            [request.memoKey],
          )
        ).rows[0],
      );
      const claim = decideClaim(
        {
          runId: found.run_id,
          owner: found.owner,
          leaseUntil: found.lease_until,
          leaseLive: found.lease_live === true,
          answer: found.answer,
          providerFailures: found.provider_failures,
          rejected: found.rejected,
        },
        request,
        owner,
      );
      if (claim.kind !== 'owned') return claim;
      await db.query(
        `UPDATE model_memo SET owner = $2, lease_until = clock_timestamp() + $3 * interval '1 millisecond',
           run_id = $4, provider_failures = $5, rejected = $6, updated_at = now() WHERE memo_key = $1`,
        [
          request.memoKey,
          owner,
          leaseMs,
          request.runId,
          claim.providerFailures,
          JSON.stringify(claim.rejected),
        ],
      );
      return claim;
    });
  }

  async renew(memoKey: string, owner: string, leaseMs: number): Promise<boolean> {
    const result = await this.pool.query(
      `UPDATE model_memo SET lease_until = clock_timestamp() + $3 * interval '1 millisecond', updated_at = now()
       WHERE memo_key = $1 AND owner = $2 AND answer IS NULL`,
      [memoKey, owner, leaseMs],
    );
    return result.rowCount === 1;
  }

  async complete(memoKey: string, answer: StoredAnswer): Promise<StoredAnswer> {
    // Whoever paid, the first answer stored is kept: a late owner's answer is no better and is already paid.
    const result = await this.pool.query(
      `UPDATE model_memo SET answer = $2, owner = NULL, lease_until = NULL, updated_at = now()
       WHERE memo_key = $1 AND answer IS NULL`,
      [memoKey, JSON.stringify(answer)],
    );
    if (result.rowCount === 1) return answer;
    const stored = await this.pool.query('SELECT answer FROM model_memo WHERE memo_key = $1', [memoKey]);
    return StoredAnswerSchema.parse(z.object({ answer: z.unknown() }).parse(stored.rows[0]).answer);
  }

  async release(memoKey: string, owner: string, release: Release): Promise<number> {
    const counted = release.providerFailure === true || release.rejected !== undefined ? 1 : 0;
    const result = await this.pool.query(
      `UPDATE model_memo SET provider_failures = provider_failures + $3,
         rejected = CASE WHEN $4::jsonb IS NULL THEN rejected ELSE rejected || jsonb_build_array($4::jsonb) END,
         owner = CASE WHEN owner = $2 THEN NULL ELSE owner END,
         lease_until = CASE WHEN owner = $2 THEN NULL ELSE lease_until END,
         updated_at = now()
       WHERE memo_key = $1 RETURNING provider_failures`,
      [memoKey, owner, counted, release.rejected === undefined ? null : JSON.stringify(release.rejected)],
    );
    return z.array(z.object({ provider_failures: z.number() })).parse(result.rows)[0]?.provider_failures ?? 0;
  }

  async count(): Promise<number> {
    const result = await this.pool.query(
      'SELECT count(*)::int AS n FROM model_memo WHERE answer IS NOT NULL',
    );
    return z.object({ n: z.number() }).parse(result.rows[0]).n;
  }

  async sweep(before: Date, openWorkflowIds: ReadonlySet<string>): Promise<number> {
    const result = await this.pool.query(
      'DELETE FROM model_memo WHERE updated_at < $1 AND NOT (workflow_id = ANY($2::text[]))',
      [before, [...openWorkflowIds]],
    );
    return result.rowCount ?? 0;
  }

  async close(): Promise<void> {
    // The pool belongs to the composition root, which ends it once every store is done.
    return;
  }
}
