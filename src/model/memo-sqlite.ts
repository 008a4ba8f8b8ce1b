import type Database from 'better-sqlite3';
import { z } from 'zod';
import { openDatabase } from '../lib/sqlite';
import { decideClaim, RejectedListSchema, StoredAnswerSchema } from './memo';
import type { AnswerMemo, Claim, MemoRequest, Release, StoredAnswer } from './memo';

const RowSchema = z.object({
  run_id: z.string(),
  owner: z.string().nullable(),
  lease_until: z.number().nullable(),
  answer: z.string().nullable(),
  provider_failures: z.number(),
  rejected: z.string(),
});

/** The memo in the embedded SQLite file of one machine (the default without DATABASE_URL). */
export class SqliteAnswerMemo implements AnswerMemo {
  private readonly db: Database.Database;

  constructor(file: string) {
    this.db = openDatabase(file);
    this.db.exec(`CREATE TABLE IF NOT EXISTS model_memo (
      memo_key TEXT PRIMARY KEY,
      workflow_id TEXT NOT NULL,
      step TEXT NOT NULL,
      request_hash TEXT NOT NULL,
      run_id TEXT NOT NULL,
      owner TEXT,
      lease_until INTEGER,
      answer TEXT,
      provider_failures INTEGER NOT NULL DEFAULT 0,
      rejected TEXT NOT NULL DEFAULT '[]',
      created_at INTEGER NOT NULL,
      updated_at INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS model_memo_workflow_id ON model_memo (workflow_id);`);
  }

  async claim(request: MemoRequest, owner: string, leaseMs: number): Promise<Claim> {
    const now = Date.now();
    const run = this.db.transaction((): Claim => {
      const found = this.row(request.memoKey);
      if (found === undefined) {
        this.db
          .prepare(
            `INSERT INTO model_memo (memo_key, workflow_id, step, request_hash, run_id, owner, lease_until,
               created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
          )
          .run(
            request.memoKey,
            request.workflowId,
            request.step,
            request.requestHash,
            request.runId,
            owner,
            now + leaseMs,
            now,
            now,
          );
        return { kind: 'owned', providerFailures: 0, rejected: [] };
      }
      const claim = decideClaim(
        {
          runId: found.run_id,
          owner: found.owner,
          leaseUntil: found.lease_until === null ? null : new Date(found.lease_until),
          leaseLive: found.lease_until !== null && found.lease_until > now,
          answer: found.answer === null ? null : (JSON.parse(found.answer) as unknown),
          providerFailures: found.provider_failures,
          rejected: JSON.parse(found.rejected) as unknown,
        },
        request,
        owner,
      );
      if (claim.kind !== 'owned') return claim;
      this.db
        .prepare(
          `UPDATE model_memo SET owner = ?, lease_until = ?, run_id = ?, provider_failures = ?, rejected = ?,
             updated_at = ? WHERE memo_key = ?`,
        )
        .run(
          owner,
          now + leaseMs,
          request.runId,
          claim.providerFailures,
          JSON.stringify(claim.rejected),
          now,
          request.memoKey,
        );
      return claim;
    });
    // IMMEDIATE takes the write lock before the read, so two claimers serialise instead of both reading "free".
    return run.immediate();
  }

  async renew(memoKey: string, owner: string, leaseMs: number): Promise<boolean> {
    const now = Date.now();
    const result = this.db
      .prepare(
        'UPDATE model_memo SET lease_until = ?, updated_at = ? WHERE memo_key = ? AND owner = ? AND answer IS NULL',
      )
      .run(now + leaseMs, now, memoKey, owner);
    return result.changes === 1;
  }

  async complete(memoKey: string, answer: StoredAnswer): Promise<StoredAnswer> {
    const now = Date.now();
    const run = this.db.transaction((): StoredAnswer => {
      // Whoever paid, the first answer stored is kept: a late owner's answer is no better and is already paid.
      const found = this.row(memoKey);
      if (found?.answer !== null && found?.answer !== undefined) {
        return StoredAnswerSchema.parse(JSON.parse(found.answer));
      }
      this.db
        .prepare(
          `UPDATE model_memo SET answer = ?, owner = NULL, lease_until = NULL, updated_at = ? WHERE memo_key = ?`,
        )
        .run(JSON.stringify(answer), now, memoKey);
      return answer;
    });
    return run.immediate();
  }

  async release(memoKey: string, owner: string, release: Release): Promise<number> {
    const now = Date.now();
    const run = this.db.transaction((): number => {
      const found = this.row(memoKey);
      if (found === undefined) return 0;
      const rejected = RejectedListSchema.parse(JSON.parse(found.rejected));
      if (release.rejected !== undefined) rejected.push(release.rejected);
      const failures =
        found.provider_failures +
        (release.providerFailure === true || release.rejected !== undefined ? 1 : 0);
      this.db
        .prepare(
          `UPDATE model_memo SET provider_failures = ?, rejected = ?, updated_at = ?,
             owner = CASE WHEN owner = ? THEN NULL ELSE owner END,
             lease_until = CASE WHEN owner = ? THEN NULL ELSE lease_until END
           WHERE memo_key = ?`,
        )
        .run(failures, JSON.stringify(rejected), now, owner, owner, memoKey);
      return failures;
    });
    return run.immediate();
  }

  async count(): Promise<number> {
    const row = z
      .object({ n: z.number() })
      .parse(this.db.prepare('SELECT count(*) AS n FROM model_memo WHERE answer IS NOT NULL').get());
    return row.n;
  }

  async sweep(before: Date, openWorkflowIds: ReadonlySet<string>): Promise<number> {
    const run = this.db.transaction((): number => {
      const rows = z
        .array(z.object({ memo_key: z.string(), workflow_id: z.string() }))
        .parse(
          this.db
            .prepare('SELECT memo_key, workflow_id FROM model_memo WHERE updated_at < ?')
            .all(before.getTime()),
        );
      const remove = this.db.prepare('DELETE FROM model_memo WHERE memo_key = ?');
      let removed = 0;
      for (const row of rows) {
        if (openWorkflowIds.has(row.workflow_id)) continue;
        removed += remove.run(row.memo_key).changes;
      }
      return removed;
    });
    return run.immediate();
  }

  async close(): Promise<void> {
    this.db.close();
    return;
  }

  private row(memoKey: string): z.infer<typeof RowSchema> | undefined {
    const row = this.db
      .prepare(
        'SELECT run_id, owner, lease_until, answer, provider_failures, rejected FROM model_memo WHERE memo_key = ?',
      )
      .get(memoKey);
    return row === undefined ? undefined : RowSchema.parse(row);
  }
}
