import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import type { RawBuilder } from 'kysely';
import { clockMs } from '../store/clock';
import { forUpdate, jsonOf } from '../store/sql';
import type { Sql } from '../store/sql';
import {
  admit,
  calibrate,
  callsLastMinute,
  effectiveLimits,
  freshState,
  landed,
  reserve,
  settle,
  upgradedState,
} from './rate-limit';
import type { CallCost, CallEnd, LimitSettings, LimitState } from './rate-limit';

/** A budget a call draws on, with the limits it starts with when it is first used (raised later by the CLI). */
export interface BudgetRef {
  id: string;
  tokens?: number | undefined;
  usd?: number | undefined;
}

/** One call asking for its turn. `holdKey` is the step's idempotency key: a retry of the attempt keeps its place. */
export interface HoldRequest {
  scope: string;
  holdKey: string;
  /** Estimated tokens (the prompt's and the most the call may answer), for the pacing. */
  tokens: number;
  /**
   * What the budget holds for the call: the most the provider may bill for it (its worst case, pacer.ts), in
   * tokens (`tokens` when absent) and in dollars (0 without a price).
   */
  budgetTokens?: number | undefined;
  usd: number;
  budget?: BudgetRef | undefined;
  /** The run to wake when a budget it waits for is raised. */
  workflowId: string;
  /** How long the place is kept after its start time: a worker that dies holding it gives it up then. */
  leaseMs: number;
}

export type HoldAnswer =
  /** Start in `waitMs`; `nonce` names this hold when the call ends. */
  | { kind: 'granted'; waitMs: number; nonce: string; probe: boolean }
  | { kind: 'busy'; retryInMs: number; why: 'probe' | 'concurrency' }
  /** The call would pass the budget: nothing reserved; the run was listed to be woken when it is raised. */
  | { kind: 'budget'; budget: BudgetStatus }
  /**
   * The call fits what is left once the calls under way end, not before: nothing reserved, no run listed; look
   * again in `retryInMs` (their promises end within their leases, and most end below what they promised).
   */
  | { kind: 'promised'; budget: BudgetStatus; retryInMs: number };

export interface BudgetStatus {
  id: string;
  limitTokens: number | null;
  limitUsd: number | null;
  spentTokens: number;
  spentUsd: number;
  /** Promised to calls under way or queued, not yet spent. */
  reservedTokens: number;
  reservedUsd: number;
}

/** What a scope's pacing looks like now, for the progress line and the tests. */
export interface ScopeStatus {
  scope: string;
  limits: { requestsPerMinute?: number; tokensPerMinute?: number };
  callsLastMinute: number;
  refusals: number;
  overloads: number;
  /** Calls holding a place whose start is still ahead. */
  waiting: number;
}

/** What a call that ended spent: its answer's tokens (paid, kept or refused) and their price. */
export interface Spent {
  tokens: number;
  usd: number;
  /** Characters of the prompt sent, and the input tokens the provider counted for it: they calibrate estimates. */
  promptChars?: number | undefined;
  inputTokens?: number | undefined;
}

interface HoldRow {
  nonce: string;
  start_at: number;
  lease_until: number;
  sent_at: number | null;
}

/** How soon a call that fits only once the calls under way end looks again. */
const PROMISED_RETRY_MS = 2_000;

/**
 * The pacing of model calls and the budgets, shared by every worker on the store: the data folder's SQLite file on
 * one machine, PostgreSQL for a fleet. Each operation is one transaction that locks the scope's row, reads the
 * store's clock and writes the state back, so hosts whose clocks disagree still pace on one clock; a transaction
 * retried after an outage repeats nothing it had committed (PostgreSQL returns what the committed try returned,
 * see Sql.transaction; and a hold is ended once, only an ending counts).
 */
export class SqlRateLimits {
  constructor(private readonly db: Sql) {}

  /** Takes a turn for a call, under the operator's `settings` (MODEL_RPM, ...) and what the provider taught. */
  async reserve(request: HoldRequest, settings: LimitSettings): Promise<HoldAnswer> {
    return this.db.transaction(async (tx) => {
      const { state, now } = await this.lockScope(tx, request.scope);
      const existing = await tx.first(
        sql<HoldRow>`SELECT nonce, start_at, lease_until, sent_at FROM model_call_holds
          WHERE hold_key = ${request.holdKey} AND ended = ${falseOf(tx)} AND lease_until > ${now}
          ORDER BY start_at DESC LIMIT 1${forUpdate(tx)}`,
      );
      if (existing !== undefined && existing.sent_at !== null) {
        // A call let go under this key whose end was never told (its worker died after sending, or lost the store
        // as it ended): the provider may have billed it, so what it held is spent, and this call takes a new turn.
        await chargeHolds(tx, sql`hold_key = ${request.holdKey} AND nonce = ${existing.nonce}`);
      } else if (existing !== undefined && existing.start_at < now - LATE_MS) {
        // A turn long past, never used (its attempt came back late, or died waiting): the provider's counts since
        // do not have it, so it is given up and the call queues again.
        await tx.run(
          sql`UPDATE model_call_holds SET ended = ${trueOf(tx)} WHERE hold_key = ${request.holdKey}
            AND nonce = ${existing.nonce}`,
        );
      } else if (existing !== undefined) {
        // This call's place, kept by an attempt that went to wait outside (or died waiting): it is still its own.
        await tx.run(
          sql`UPDATE model_call_holds SET lease_until = ${Math.ceil(Math.max(existing.start_at, now) + request.leaseMs)}
            WHERE hold_key = ${request.holdKey} AND nonce = ${existing.nonce}`,
        );
        return {
          kind: 'granted',
          waitMs: Math.max(0, existing.start_at - now),
          nonce: existing.nonce,
          probe: false,
        } as const;
      }
      const budgetTokens = Math.ceil(request.budgetTokens ?? request.tokens);
      if (request.budget !== undefined) {
        const budget = await this.lockBudget(tx, request.budget, now);
        const fits = (promised: boolean): boolean =>
          (budget.limitTokens === null ||
            budget.spentTokens + (promised ? budget.reservedTokens : 0) + budgetTokens <=
              budget.limitTokens) &&
          (budget.limitUsd === null ||
            budget.spentUsd + (promised ? budget.reservedUsd : 0) + request.usd <= budget.limitUsd);
        if (!fits(false)) {
          await tx.run(
            sql`INSERT INTO model_budget_waiters (budget_id, workflow_id, since)
              VALUES (${budget.id}, ${request.workflowId}, ${tx.now()}) ON CONFLICT DO NOTHING`,
          );
          return { kind: 'budget', budget } as const;
        }
        // Not listed: what it waits for is the calls under way, not a raise. A run is listed only when what is
        // spent leaves it no room, which only a raise changes (and a raise empties the list).
        if (!fits(true)) return { kind: 'promised', budget, retryInMs: PROMISED_RETRY_MS } as const;
      }
      const inFlight = await tx.first(
        sql<{ n: number }>`SELECT count(*) AS n FROM model_call_holds WHERE scope = ${request.scope}
          AND ended = ${falseOf(tx)} AND start_at <= ${now} AND lease_until > ${now}`,
      );
      const granted = reserve(state, now, { tokens: request.tokens }, settings, Number(inFlight?.n ?? 0));
      if (granted.kind === 'busy') return granted;
      const nonce = randomUUID();
      await tx.run(
        sql`INSERT INTO model_call_holds (hold_key, nonce, scope, budget_id, tokens, budget_tokens, usd, start_at,
          lease_until)
          VALUES (${request.holdKey}, ${nonce}, ${request.scope}, ${request.budget?.id ?? null},
          ${Math.ceil(request.tokens)}, ${budgetTokens}, ${request.usd}, ${Math.ceil(granted.startAt)},
          ${Math.ceil(granted.startAt + request.leaseMs)})`,
      );
      await this.writeState(tx, request.scope, granted.state);
      return { kind: 'granted', waitMs: granted.startAt - now, nonce, probe: granted.probe } as const;
    });
  }

  /**
   * Ends a call's hold: what it spent goes to its budget (once: a hold already ended counts nothing), and what the
   * provider said (an answer's headers, a refusal's delay) goes to the scope's pacing. `spent` 'held': a call sent
   * whose cost is not known (no answer came: a timeout, a reset) is charged what its hold promised, the most the
   * provider may bill for it; undefined: the call cost nothing (never sent, or refused before it was served).
   */
  async end(
    scope: string,
    hold: { holdKey: string; nonce: string },
    end: CallEnd,
    settings: LimitSettings,
    spent?: Spent | 'held',
  ): Promise<void> {
    const { holdKey, nonce } = hold;
    await this.db.transaction(async (tx) => {
      const { state, now } = await this.lockScope(tx, scope);
      const mine = sql`hold_key = ${holdKey} AND nonce = ${nonce}`;
      if (spent === 'held') await chargeHolds(tx, mine);
      const ended = await tx.rows(
        sql<{ budget_id: string | null }>`UPDATE model_call_holds SET ended = ${trueOf(tx)}
          WHERE ${mine} AND ended = ${falseOf(tx)} RETURNING budget_id`,
      );
      const budgetId = ended[0]?.budget_id ?? null;
      if (spent !== undefined && spent !== 'held' && budgetId !== null && ended.length === 1) {
        await addSpent(tx, budgetId, spent);
      }
      // The calls sent after this one (their turns came after its, and before now): the provider's count in the
      // answer's headers does not have them yet. And where the queue of turns still ahead starts.
      const since = await tx.first(
        sql<{
          requests: number;
          tokens: number | null;
        }>`SELECT count(*) AS requests, sum(later.tokens) AS tokens
          FROM model_call_holds later JOIN model_call_holds mine ON mine.hold_key = ${holdKey}
          AND mine.nonce = ${nonce} WHERE later.scope = ${scope} AND later.start_at >= mine.start_at
          AND later.start_at <= ${now} AND NOT (later.hold_key = ${holdKey} AND later.nonce = ${nonce})`,
      );
      const queue = await tx.first(
        sql<{
          first: number | null;
        }>`SELECT min(start_at) AS first FROM model_call_holds WHERE scope = ${scope}
          AND ended = ${falseOf(tx)} AND start_at > ${now}`,
      );
      const queueStart =
        queue?.first === null || queue?.first === undefined ? undefined : Number(queue.first);
      const settled = settle(
        state,
        now,
        end,
        settings,
        { requests: Number(since?.requests ?? 0), tokens: Number(since?.tokens ?? 0) },
        queueStart,
      );
      let next = landed(settled.state, nonce);
      const shift = Math.round(settled.shift);
      if (shift !== 0) {
        // The turns ahead move together; a waiter reads its turn again while it waits (turn).
        await tx.run(
          sql`UPDATE model_call_holds SET start_at = start_at + ${shift},
            lease_until = lease_until + ${Math.max(0, shift)}
            WHERE scope = ${scope} AND ended = ${falseOf(tx)} AND start_at > ${now}`,
        );
      }
      if (spent !== 'held' && spent?.promptChars !== undefined && spent.inputTokens !== undefined)
        next = {
          ...next,
          charsPerToken: calibrate(next.charsPerToken, spent.promptChars, spent.inputTokens),
        };
      await this.writeState(tx, scope, next);
      // Holds are kept ten minutes past their lease (a repeat of an ending, retried through an outage, must find
      // its hold ended), then dropped; a sent one whose budget has not charged it yet is charged first.
      await chargeHolds(
        tx,
        sql`scope = ${scope} AND sent_at IS NOT NULL AND lease_until <= ${now} AND budget_id IS NOT NULL`,
      );
      await tx.run(
        sql`DELETE FROM model_call_holds WHERE scope = ${scope} AND lease_until < ${now - 600_000}`,
      );
    });
  }

  /**
   * Stamps a call as sent, its turn come, if the fleet's sends leave room for it (rate-limit.ts, admit); else says
   * how long until they would. A hold already ended (given up as long past) is sent nowhere: it queues again.
   */
  async admit(
    scope: string,
    hold: { holdKey: string; nonce: string },
    cost: CallCost,
    settings: LimitSettings,
  ): Promise<{ kind: 'send' } | { kind: 'wait'; waitMs: number } | { kind: 'gone' }> {
    return this.db.transaction(async (tx) => {
      const { state, now } = await this.lockScope(tx, scope);
      const mine = await tx.first(
        sql<{
          nonce: string;
          lease_until: number;
        }>`SELECT nonce, lease_until FROM model_call_holds WHERE hold_key = ${hold.holdKey}
          AND nonce = ${hold.nonce} AND ended = ${falseOf(tx)}`,
      );
      if (mine === undefined) return { kind: 'gone' } as const;
      const answer = admit(state, now, cost, settings, {
        nonce: hold.nonce,
        until: Number(mine.lease_until),
      });
      if (answer.kind === 'wait') return answer;
      // From here the provider may bill it: a hold that lapses unended is charged (chargeHolds).
      await tx.run(
        sql`UPDATE model_call_holds SET sent_at = ${now} WHERE hold_key = ${hold.holdKey}
          AND nonce = ${hold.nonce}`,
      );
      await this.writeState(tx, scope, answer.state);
      return { kind: 'send' } as const;
    });
  }

  /** How long until a held turn starts (store clock); undefined when the hold is gone or ended. */
  async turn(hold: { holdKey: string; nonce: string }): Promise<number | undefined> {
    const now = await clockMs(this.db);
    const row = await this.db.first(
      sql<{ start_at: number }>`SELECT start_at FROM model_call_holds WHERE hold_key = ${hold.holdKey}
        AND nonce = ${hold.nonce} AND ended = ${falseOf(this.db)}`,
    );
    return row === undefined ? undefined : Number(row.start_at) - now;
  }

  /** The learned characters a token of a scope, for estimating a call before it is reserved. */
  async charsPerToken(scope: string): Promise<number> {
    const row = await this.db.first(
      sql<{ state: unknown }>`SELECT state FROM model_limits WHERE scope = ${scope}`,
    );
    return row === undefined ? freshState(0).charsPerToken : stateOf(row.state, 0).charsPerToken;
  }

  async status(scope: string, settings: LimitSettings = {}): Promise<ScopeStatus | undefined> {
    const row = await this.db.first(
      sql<{ state: unknown }>`SELECT state FROM model_limits WHERE scope = ${scope}`,
    );
    if (row === undefined) return undefined;
    const now = await clockMs(this.db);
    const state = stateOf(row.state, now);
    const waiting = await this.db.first(
      sql<{ n: number }>`SELECT count(*) AS n FROM model_call_holds WHERE scope = ${scope}
        AND ended = ${falseOf(this.db)} AND start_at > ${now} AND lease_until > ${now}`,
    );
    const limits = effectiveLimits(state, settings, now);
    return {
      scope,
      limits,
      callsLastMinute: callsLastMinute(state, now),
      refusals: state.refusals,
      overloads: state.overloads,
      waiting: Number(waiting?.n ?? 0),
    };
  }

  /** Every scope the store has paced, for a status command. */
  async scopes(): Promise<string[]> {
    const rows = await this.db.rows(sql<{ scope: string }>`SELECT scope FROM model_limits ORDER BY scope`);
    return rows.map((r) => r.scope);
  }

  /** A budget as it stands, the holds of calls sent and lapsed unended (their workers died) charged first. */
  async budget(id: string): Promise<BudgetStatus | undefined> {
    return this.db.transaction(async (tx) => {
      const now = await clockMs(tx);
      await chargeLapsed(tx, id, now);
      return this.readBudget(tx, id, now, false);
    });
  }

  /** Budgets with runs waiting on them, and those runs. */
  async waitingBudgets(): Promise<{ budget: BudgetStatus; workflowIds: string[] }[]> {
    const rows = await this.db.rows(
      sql<{ budget_id: string; workflow_id: string }>`SELECT budget_id, workflow_id FROM model_budget_waiters
        ORDER BY budget_id, workflow_id`,
    );
    const byBudget = new Map<string, string[]>();
    for (const row of rows)
      byBudget.set(row.budget_id, [...(byBudget.get(row.budget_id) ?? []), row.workflow_id]);
    const out: { budget: BudgetStatus; workflowIds: string[] }[] = [];
    for (const [id, workflowIds] of byBudget) {
      const budget = await this.budget(id);
      if (budget !== undefined) out.push({ budget, workflowIds });
    }
    return out;
  }

  /**
   * Sets a budget's limits (a measure left undefined keeps its limit; null lifts it), and returns the runs that
   * waited on it, taken off the list: the caller wakes them. A lower limit than spent is refused by the caller.
   */
  async setBudget(
    id: string,
    limits: { tokens?: number | null | undefined; usd?: number | null | undefined },
  ): Promise<{ budget: BudgetStatus; woken: string[] } | undefined> {
    return this.db.transaction(async (tx) => {
      const now = await clockMs(tx);
      await chargeLapsed(tx, id, now);
      const found = await this.readBudget(tx, id, now, true);
      if (found === undefined) return undefined;
      const limitTokens = limits.tokens === undefined ? found.limitTokens : limits.tokens;
      const limitUsd = limits.usd === undefined ? found.limitUsd : limits.usd;
      await tx.run(
        sql`UPDATE model_budgets SET limit_tokens = ${limitTokens}, limit_usd = ${limitUsd},
          updated_at = ${tx.now()} WHERE budget_id = ${id}`,
      );
      const woken = await tx.rows(
        sql<{
          workflow_id: string;
        }>`DELETE FROM model_budget_waiters WHERE budget_id = ${id} RETURNING workflow_id`,
      );
      return { budget: { ...found, limitTokens, limitUsd }, woken: woken.map((w) => w.workflow_id) };
    });
  }

  private async lockScope(tx: Sql, scope: string): Promise<{ state: LimitState; now: number }> {
    // A fresh scope's buckets are full (their debt cleared long ago).
    await tx.run(
      sql`INSERT INTO model_limits (scope, state, updated_at) VALUES (${scope}, ${JSON.stringify(freshState(0))},
        ${tx.now()}) ON CONFLICT (scope) DO NOTHING`,
    );
    const row = await tx.first(
      sql<{ state: unknown }>`SELECT state FROM model_limits WHERE scope = ${scope}${forUpdate(tx)}`,
    );
    // The clock is read once the scope is ours: a time read before waiting for the lock would stamp a send (admit)
    // earlier than it went.
    const now = await clockMs(tx);
    return { state: stateOf(row?.state, now), now };
  }

  private async writeState(tx: Sql, scope: string, state: LimitState): Promise<void> {
    await tx.run(
      sql`UPDATE model_limits SET state = ${JSON.stringify(state)}, updated_at = ${tx.now()} WHERE scope = ${scope}`,
    );
  }

  private async lockBudget(tx: Sql, ref: BudgetRef, now: number): Promise<BudgetStatus> {
    await ensureBudget(tx, ref);
    await chargeLapsed(tx, ref.id, now);
    const budget = await this.readBudget(tx, ref.id, now, true);
    if (budget === undefined) throw new Error(`budget ${ref.id} vanished while it was read`);
    return budget;
  }

  private async readBudget(
    db: Sql,
    id: string,
    now: number,
    lock: boolean,
  ): Promise<BudgetStatus | undefined> {
    const row = await db.first(
      sql<{
        limit_tokens: number | null;
        limit_usd: number | null;
        spent_tokens: number;
        spent_usd: number;
      }>`SELECT limit_tokens, limit_usd, spent_tokens, spent_usd FROM model_budgets WHERE budget_id = ${id}${
        lock ? forUpdate(db) : sql.raw('')
      }`,
    );
    if (row === undefined) return undefined;
    const reserved = await db.first(
      sql<{
        tokens: number | null;
        usd: number | null;
      }>`SELECT sum(coalesce(budget_tokens, tokens)) AS tokens, sum(usd) AS usd FROM model_call_holds WHERE budget_id = ${id} AND ended = ${falseOf(db)} AND lease_until > ${now}`,
    );
    return {
      id,
      limitTokens: row.limit_tokens === null ? null : Number(row.limit_tokens),
      limitUsd: row.limit_usd === null ? null : Number(row.limit_usd),
      spentTokens: Number(row.spent_tokens),
      spentUsd: Number(row.spent_usd),
      reservedTokens: Number(reserved?.tokens ?? 0),
      reservedUsd: Number(reserved?.usd ?? 0),
    };
  }
}

/** Makes the budget `ref` names with its limits, unless it exists (a budget's limits are set once, then raised). */
export async function ensureBudget(tx: Sql, ref: BudgetRef): Promise<void> {
  await tx.run(
    sql`INSERT INTO model_budgets (budget_id, limit_tokens, limit_usd, created_at, updated_at)
      VALUES (${ref.id}, ${ref.tokens ?? null}, ${ref.usd ?? null}, ${tx.now()}, ${tx.now()})
      ON CONFLICT (budget_id) DO NOTHING`,
  );
}

/** Adds what was spent to a budget's spending (inside the transaction that makes the spending count once). */
export async function addSpent(
  tx: Sql,
  budgetId: string,
  spent: { tokens: number; usd: number },
): Promise<void> {
  await tx.run(
    sql`UPDATE model_budgets SET spent_tokens = spent_tokens + ${Math.round(spent.tokens)},
      spent_usd = spent_usd + ${spent.usd}, updated_at = ${tx.now()} WHERE budget_id = ${budgetId}`,
  );
}

/**
 * Charges the holds `where` picks, not ended yet, what they promised (their worst case), and ends them: calls let
 * go to the provider whose cost is not known. Ended, they count once; a later end of the same hold counts nothing.
 */
async function chargeHolds(tx: Sql, where: RawBuilder<unknown>): Promise<void> {
  const charged = await tx.rows(
    sql<{
      budget_id: string | null;
      tokens: number;
      usd: number;
    }>`UPDATE model_call_holds SET ended = ${trueOf(tx)} WHERE ${where} AND ended = ${falseOf(tx)}
      RETURNING budget_id, coalesce(budget_tokens, tokens) AS tokens, usd`,
  );
  for (const hold of charged)
    if (hold.budget_id !== null)
      await addSpent(tx, hold.budget_id, { tokens: Number(hold.tokens), usd: Number(hold.usd) });
}

/** A budget's holds of calls sent whose leases lapsed unended (their workers died): charged as spent. */
async function chargeLapsed(tx: Sql, budgetId: string, now: number): Promise<void> {
  await chargeHolds(tx, sql`budget_id = ${budgetId} AND sent_at IS NOT NULL AND lease_until <= ${now}`);
}

/** A turn this far past when its call comes for it is given up: the call queues again. */
const LATE_MS = 1_000;

function falseOf(db: Sql): boolean | number {
  return db.dialect === 'postgres' ? false : 0;
}

function trueOf(db: Sql): boolean | number {
  return db.dialect === 'postgres' ? true : 1;
}

/** The stored state, with defaults for what an older row lacks. */
function stateOf(raw: unknown, now: number): LimitState {
  const parsed = raw === undefined || raw === null ? {} : jsonOf(raw);
  return upgradedState({
    ...freshState(now),
    ...(typeof parsed === 'object' && parsed !== null ? parsed : {}),
  });
}
