/**
 * The pacing's shared store on both backends, for the pacing tests: a SQLite file and a fresh PostgreSQL schema,
 * each opened twice (two handles on one store stand for two worker hosts), and a model that paces its calls
 * through one of them against a provider's URL, as the worker builds it (AiSdkModel with a Pacer).
 */
import path from 'node:path';
import { AiSdkModel } from '../src/model/ai-sdk';
import { remoteModel } from '../src/model/choose';
import { Pacer } from '../src/model/pacer';
import { findProvider } from '../src/model/providers';
import type { LimitSettings } from '../src/model/rate-limit';
import { SqlRateLimits } from '../src/model/rate-limit-store';
import type { ModelCall } from '../src/model/types';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import { openSqlite } from '../src/store/sql-sqlite';
import type { Sql } from '../src/store/sql';
import { silentLogger } from './helpers';
import { freshSchema } from './postgres';
import { scratchDir } from './scratch';
import type { Defer } from './scratch';

export interface PacingStore {
  name: 'SQLite' | 'PostgreSQL';
  /** Two handles on one fresh store, and the first one's SQL, closed when the file's tests end. */
  open(defer: Defer): Promise<[SqlRateLimits, SqlRateLimits, Sql]>;
}

export const PACING_STORES: PacingStore[] = [
  {
    name: 'SQLite',
    open(defer) {
      const file = path.join(scratchDir(defer, 'pacing-'), 'memo.db');
      const a = openSqlite(file, 'memo');
      const b = openSqlite(file, 'memo');
      defer(async () => {
        await a.close();
        await b.close();
      });
      return Promise.resolve([new SqlRateLimits(a), new SqlRateLimits(b), a]);
    },
  },
  {
    name: 'PostgreSQL',
    async open(defer) {
      const url = await freshSchema(defer);
      const a = await openPostgres(url);
      const b = await openPostgres(url);
      defer(async () => {
        await a.end();
        await b.end();
      });
      const sqlA = postgresSql(a);
      return [new SqlRateLimits(sqlA), new SqlRateLimits(postgresSql(b)), sqlA];
    },
  },
];

/** A model of `provider` at `baseUrl` whose calls take turns in `limits`, under the operator's `settings`. */
export function pacedModel(
  limits: SqlRateLimits,
  baseUrl: string,
  {
    provider = 'openai-compatible',
    model = 'gpt-4o-mini',
    settings = {},
    requestTimeoutMs = 10_000,
  }: { provider?: string; model?: string; settings?: LimitSettings; requestTimeoutMs?: number } = {},
): AiSdkModel {
  const found = findProvider(provider);
  if (found === undefined) throw new Error(`no provider ${provider}`);
  return new AiSdkModel(
    remoteModel(found, { model, baseUrl, apiKey: 'test' }),
    requestTimeoutMs,
    (scope, info) => new Pacer(limits, scope, info, { leaseMs: 60_000, settings, log: silentLogger }),
  );
}

/** A paced call of step `step` under `key`, whose attempt and step may last `forMs`. */
export function pacedCall(key: string, forMs: number, step = 'summarize'): ModelCall {
  const ends = Date.now() + forMs;
  return {
    idempotencyKey: key,
    signal: AbortSignal.timeout(forMs + 5_000),
    pacing: { step, workflowId: `wf-${key}`, attemptEndsAt: ends, stepEndsAt: ends },
  };
}
