import type pg from 'pg';
import { sql } from 'kysely';
import type { RawBuilder } from 'kysely';
import { Database } from '../lib/postgres';
import { migrate } from './migrate';
import { MIGRATIONS } from './migrations';
import type { Migration } from './migrations';
import type { Schema } from './schema';
import { builderFor, compiled, isSafeToRepeat, written } from './sql';
import type { Query, Sql } from './sql';

const build = builderFor('postgres');

/**
 * The stores' handle on PostgreSQL: every statement goes through `db` (its pool, timeouts and outage retries), and
 * a transaction is `db.transaction`, retried whole and committed once. A statement outside a transaction is sent
 * again after an outage only when that is safe (a read, or a write marked safeToRepeat); any other write runs as a
 * transaction of its own, so its retry finds it committed instead of counting, appending or inserting twice. It
 * borrows the pool: whoever opened `db` ends it.
 */
export function postgresSql(db: Database): Sql {
  return new PostgresSql(db, undefined);
}

/** Opens the database and brings the schema up to date (see migrate); the caller ends it. */
export async function openPostgres(
  url: string,
  migrations: readonly Migration[] = MIGRATIONS,
  retryForMs?: number,
): Promise<Database> {
  const db = new Database(url, retryForMs);
  try {
    await db.transaction(async () => undefined, { safeToRepeat: true });
    await migrate(postgresSql(db), migrations);
  } catch (err) {
    await db.end();
    throw new Error(
      `PostgreSQL at DATABASE_URL could not be prepared: ${err instanceof Error ? err.message : String(err)}; ` +
        'check that the server answers and the URL names a database this user may create tables in',
      { cause: err },
    );
  }
  return db;
}

class PostgresSql implements Sql {
  readonly dialect = 'postgres';
  readonly where = 'PostgreSQL';
  readonly build = build;
  readonly lockRows = true;

  constructor(
    private readonly db: Database,
    /** The client of the transaction this handle is in, if any. */
    private readonly client: pg.PoolClient | undefined,
  ) {}

  async rows<O>(query: Query<O>): Promise<O[]> {
    // The rows are what the statement returned, as its query (the builder, or a template by hand) typed them.
    return (await this.exec(query)).rows as O[];
  }

  async first<O>(query: Query<O>): Promise<O | undefined> {
    return (await this.rows(query))[0];
  }

  async run(query: Query<unknown>): Promise<number> {
    return (await this.exec(query)).rowCount ?? 0;
  }

  runUnsynced(query: Query<unknown>): Promise<number> {
    return this.run(query);
  }

  runSyncedAside(query: Query<unknown>): Promise<number> {
    return this.run(query);
  }

  /** A commit is durable when it returns (synchronous_commit), so `syncAside` changes nothing here. */
  transaction<T>(work: (tx: Sql) => Promise<T>, options: { safeToRepeat?: boolean } = {}): Promise<T> {
    if (this.client !== undefined) throw new Error('a PostgreSQL transaction cannot start inside another');
    return this.db.transaction((client) => work(new PostgresSql(this.db, client)), options);
  }

  async syncCommitted(): Promise<void> {
    return;
  }

  async lock(key: number | string): Promise<void> {
    await this.run(
      typeof key === 'number'
        ? sql`SELECT pg_advisory_xact_lock(${key})`
        : sql`SELECT pg_advisory_xact_lock(hashtext(${key}))`,
    );
  }

  now() {
    return written(sql`now()`);
  }

  clock(offsetMs = 0) {
    return written(
      offsetMs === 0
        ? sql`clock_timestamp()`
        : sql`clock_timestamp() + ${offsetMs} * interval '1 millisecond'`,
    );
  }

  time(date: Date): Date {
    return date;
  }

  ago(msAgo: number): RawBuilder<Date> {
    return sql<Date>`now() - ${msAgo} * interval '1 millisecond'`;
  }

  jsonAppend(column: string, json: string) {
    return sql<string>`${sql.ref(column)} || jsonb_build_array(${json}::jsonb)`;
  }

  async hasColumn(table: keyof Schema, column: string): Promise<boolean> {
    const found = await this.first(
      sql`SELECT 1 AS yes FROM information_schema.columns
          WHERE table_schema = current_schema() AND table_name = ${table} AND column_name = ${column}`,
    );
    return found !== undefined;
  }

  async close(): Promise<void> {
    return;
  }

  private async exec(query: Query<unknown>): Promise<{ rows: unknown[]; rowCount: number }> {
    const { sql: text, parameters } = compiled(query, build);
    const values = [...parameters];
    const answer = (result: pg.QueryResult) => ({ rows: result.rows, rowCount: result.rowCount ?? 0 });
    if (this.client !== undefined) return answer(await this.client.query(text, values));
    if (isSafeToRepeat(query, text)) return answer(await this.db.query(text, values));
    return this.db.transaction(async (client) => answer(await client.query(text, values)));
  }
}
