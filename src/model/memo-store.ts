import { sql } from 'kysely';
import type { Selectable } from 'kysely';
import { openSqlite } from '../store/sql-sqlite';
import { dateOf, flagOf, forUpdate, jsonOf, safeToRepeat, sweepClosedWorkflows } from '../store/sql';
import type { Sql } from '../store/sql';
import type { ModelMemoTable, WrittenTime } from '../store/schema';
import { decideClaim, RejectedListSchema, StoredAnswerSchema } from './memo';
import type { AnswerMemo, Claim, MemoEntryView, MemoRequest, Release, StoredAnswer } from './memo';

/** A memo row as a claim reads it (see Sql: the types each backend gives back). */
type EntryRow = Pick<
  Selectable<ModelMemoTable>,
  'run_id' | 'owner' | 'lease_until' | 'answer' | 'provider_failures' | 'rejected'
> & { lease_live: boolean | number | null };

/**
 * The memo in either backend: the embedded SQLite file of one machine, or PostgreSQL for a fleet, where leases are
 * read against the database's clock, so hosts whose clocks disagree still agree on whose claim is live.
 */
export class SqlAnswerMemo implements AnswerMemo {
  constructor(private readonly db: Sql) {}

  async claim(request: MemoRequest, owner: string, leaseMs: number): Promise<Claim> {
    for (;;) {
      // A new key is claimed by the INSERT alone: one statement, no transaction to hold open. Unsynced on
      // SQLite: a claim keeps a stalled twin from paying again, and both twins live on the machine whose file it
      // is; an OS crash that loses the claim ends both, and whatever was paid and not stored is lost with or
      // without it. The answer (complete) is synced, and with it every claim before it. Safe to repeat: a repeat
      // after it committed inserts nothing, and the read below finds the row this owner holds.
      const now = this.db.now();
      const created = await this.db.runUnsynced(
        safeToRepeat(
          sql`INSERT INTO model_memo (memo_key, workflow_id, step, request_hash, run_id, owner, lease_until,
            created_at, updated_at) VALUES (${request.memoKey}, ${request.workflowId}, ${request.step},
            ${request.requestHash}, ${request.runId}, ${owner}, ${this.db.clock(leaseMs)}, ${now}, ${now})
            ON CONFLICT (memo_key) DO NOTHING`,
        ),
      );
      if (created === 1) return { kind: 'owned', providerFailures: 0, rejected: [] };
      const claim = await this.db.transaction((tx) => this.claimExisting(tx, request, owner, leaseMs));
      // A twin's answer may have been committed the moment before, its sync still under way (see complete): the
      // step reports success with it only once it is on disk.
      if (claim !== 'gone' && claim.kind === 'answered') await this.db.syncCommitted();
      // Swept between the INSERT and the read: claim it as new.
      if (claim !== 'gone') return claim;
    }
  }

  private async claimExisting(
    tx: Sql,
    request: MemoRequest,
    owner: string,
    leaseMs: number,
  ): Promise<Claim | 'gone'> {
    // Locked until commit (FOR UPDATE, or SQLite's write lock): concurrent claimers of one key take turns.
    const found = await tx.first(
      sql<EntryRow>`SELECT run_id, owner, lease_until, lease_until > ${tx.clock()} AS lease_live, answer,
        provider_failures, rejected FROM model_memo WHERE memo_key = ${request.memoKey}${forUpdate(tx)}`,
    );
    if (found === undefined) return 'gone';
    const claim = decideClaim(
      {
        runId: found.run_id,
        owner: found.owner,
        leaseUntil: found.lease_until === null ? null : dateOf(found.lease_until),
        leaseLive: flagOf(found.lease_live),
        answer: found.answer === null ? null : jsonOf(found.answer),
        providerFailures: found.provider_failures,
        rejected: jsonOf(found.rejected),
      },
      request,
      owner,
    );
    if (claim.kind !== 'owned') return claim;
    await tx.run(
      sql`UPDATE model_memo SET owner = ${owner}, lease_until = ${tx.clock(leaseMs)}, run_id = ${request.runId},
        provider_failures = ${claim.providerFailures}, rejected = ${JSON.stringify(claim.rejected)},
        updated_at = ${tx.now()} WHERE memo_key = ${request.memoKey}`,
    );
    return claim;
  }

  async renew(memoKey: string, owner: string, leaseMs: number): Promise<boolean> {
    // Unsynced on SQLite, as a new claim (see claim). Safe to repeat: the row it extended still matches.
    const changed = await this.db.runUnsynced(
      safeToRepeat(
        this.db.build
          .updateTable('model_memo')
          .set({ lease_until: this.db.clock(leaseMs), updated_at: this.db.now() })
          .where('memo_key', '=', memoKey)
          .where('owner', '=', owner)
          .where('answer', 'is', null),
      ),
    );
    return changed === 1;
  }

  async complete(memoKey: string, answer: StoredAnswer): Promise<StoredAnswer> {
    // Whoever paid, the first answer stored is kept: a late owner's answer is no better and is already paid.
    // Durable before this returns, its sync aside from the worker's thread (see runSyncedAside); a twin's answer
    // found instead was synced by that sync too, as it was committed before this statement ran. Safe to repeat:
    // a repeat after it committed changes nothing, and the read below returns the answer it stored.
    const changed = await this.db.runSyncedAside(
      safeToRepeat(
        sql`UPDATE model_memo SET answer = ${JSON.stringify(answer)}, owner = NULL, lease_until = NULL,
          updated_at = ${this.db.now()} WHERE memo_key = ${memoKey} AND answer IS NULL`,
      ),
    );
    if (changed === 1) return answer;
    const stored = await this.db.first(
      this.db.build.selectFrom('model_memo').select('answer').where('memo_key', '=', memoKey),
    );
    return StoredAnswerSchema.parse(jsonOf(stored?.answer));
  }

  async release(memoKey: string, owner: string, release: Release): Promise<number> {
    // Not safe to repeat (it counts, and appends): PostgreSQL commits it once, with a check (see Sql.rows).
    const counted = release.providerFailure === true || release.rejected !== undefined ? 1 : 0;
    const rows = await this.db.rows(
      this.db.build
        .updateTable('model_memo')
        .set((eb) => ({
          provider_failures: eb('provider_failures', '+', counted),
          owner: eb.case().when('owner', '=', owner).then(null).else(eb.ref('owner')).end(),
          lease_until: eb
            .case()
            .when('owner', '=', owner)
            .then(null)
            .else(eb.ref('lease_until').$castTo<WrittenTime>())
            .end(),
          updated_at: this.db.now(),
        }))
        .$if(release.rejected !== undefined, (q) =>
          q.set({ rejected: this.db.jsonAppend('rejected', JSON.stringify(release.rejected)) }),
        )
        .where('memo_key', '=', memoKey)
        .returning('provider_failures'),
    );
    return rows[0]?.provider_failures ?? 0;
  }

  async peek(memoKeys: readonly string[], runId: string): Promise<Map<string, MemoEntryView>> {
    const views = new Map<string, MemoEntryView>();
    // A few hundred keys a statement: well within both backends' limits on bound parameters.
    for (let i = 0; i < memoKeys.length; i += 500) {
      const rows = await this.db.rows(
        this.db.build
          .selectFrom('model_memo')
          .select(['memo_key', 'run_id', 'answer', 'rejected'])
          .where('memo_key', 'in', memoKeys.slice(i, i + 500)),
      );
      for (const row of rows)
        views.set(row.memo_key, {
          answered: row.answer !== null,
          rejected: row.run_id === runId ? RejectedListSchema.parse(jsonOf(row.rejected)) : [],
        });
    }
    return views;
  }

  async previousAnswer(workflowId: string, step: string, memoKey: string): Promise<StoredAnswer | undefined> {
    const row = await this.db.first(
      this.db.build
        .selectFrom('model_memo')
        .select(['answer'])
        .where('workflow_id', '=', workflowId)
        .where('step', '=', step)
        .where('memo_key', '<>', memoKey)
        .where('answer', 'is not', null)
        .orderBy('updated_at', 'desc')
        .limit(1),
    );
    if (row === undefined) return undefined;
    const stored = StoredAnswerSchema.safeParse(jsonOf(row.answer));
    return stored.success ? stored.data : undefined;
  }

  async count(): Promise<number> {
    const row = await this.db.first(
      this.db.build
        .selectFrom('model_memo')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .where('answer', 'is not', null),
    );
    return Number(row?.n ?? 0);
  }

  async sweep(before: Date, openWorkflowIds: ReadonlySet<string>): Promise<number> {
    const old = this.db.time(before);
    const memo = this.db.build;
    return sweepClosedWorkflows(
      this.db,
      openWorkflowIds,
      memo.selectFrom('model_memo').select(['memo_key as key', 'workflow_id']).where('updated_at', '<', old),
      (keys) => memo.deleteFrom('model_memo').where('memo_key', 'in', keys).where('updated_at', '<', old),
    );
  }

  close(): Promise<void> {
    return this.db.close();
  }
}

/** The memo in the embedded SQLite file of one machine (the default without DATABASE_URL). */
export class SqliteAnswerMemo extends SqlAnswerMemo {
  constructor(file: string) {
    super(openSqlite(file, 'memo'));
  }
}
