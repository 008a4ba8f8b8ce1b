import { sql } from 'kysely';
import type { Sql } from './sql';

/**
 * The store's clock in epoch milliseconds: PostgreSQL's for a fleet, this machine's for its SQLite file. Times the
 * store wrote are compared with this, never with a worker's or an operator's own clock, which may be off.
 */
export async function clockMs(db: Pick<Sql, 'dialect' | 'first'>): Promise<number> {
  if (db.dialect === 'sqlite') return Date.now();
  const row = await db.first(
    sql<{ now: number }>`SELECT (extract(epoch from clock_timestamp()) * 1000)::float8 AS now`,
  );
  return Math.floor(Number(row?.now));
}
