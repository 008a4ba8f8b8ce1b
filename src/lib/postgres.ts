import pg from 'pg';

/** One numbered step of a schema; see migrate. */
export interface Migration {
  version: number;
  name: string;
  sql: string;
}

/** A pool on DATABASE_URL, shared by every store of the process. */
export type Pool = pg.Pool;

// bigint columns (epoch milliseconds) come back as numbers: they stay far below 2^53.
pg.types.setTypeParser(pg.types.builtins.INT8, (value) => Number(value));

/** Opens a pool and brings the schema up to date (see migrate); the caller ends the pool. */
export async function openPostgres(url: string, migrations: readonly Migration[]) {
  const pool = new pg.Pool({ connectionString: url, max: 8 });
  // An idle client that loses its server (a restart) emits 'error'; without a listener that would end the process.
  pool.on('error', () => undefined);
  try {
    await migrate(pool, migrations);
  } catch (err) {
    await pool.end();
    throw new Error(
      `PostgreSQL at DATABASE_URL could not be prepared: ${err instanceof Error ? err.message : String(err)}; ` +
        'check that the server answers and the URL names a database this user may create tables in',
      { cause: err },
    );
  }
  return pool;
}

/**
 * Applies the migrations not yet recorded in `schema_migrations`, each in its own transaction, in version order.
 * An advisory lock makes workers starting together take turns, so each migration runs exactly once per database.
 */
export async function migrate(pool: Pool, migrations: readonly Migration[]): Promise<number[]> {
  const client = await pool.connect();
  const applied: number[] = [];
  try {
    await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
    await client.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version integer PRIMARY KEY,
      name text NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT now()
    )`);
    const done = await client.query<{ version: number }>('SELECT version FROM schema_migrations');
    const have = new Set(done.rows.map((r) => r.version));
    for (const migration of [...migrations].sort((a, b) => a.version - b.version)) {
      if (have.has(migration.version)) continue;
      await client.query('BEGIN');
      try {
        await client.query(migration.sql);
        await client.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [
          migration.version,
          migration.name,
        ]);
        await client.query('COMMIT');
        applied.push(migration.version);
      } catch (err) {
        await client.query('ROLLBACK');
        throw new Error(`migration ${migration.version} (${migration.name}) failed`, { cause: err });
      }
    }
  } finally {
    await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]).catch(() => undefined);
    client.release();
  }
  return applied;
}

/** Runs `work` in one transaction on one client of the pool. */
export async function inTransaction<T>(pool: Pool, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const result = await work(client);
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  } finally {
    client.release();
  }
}

/** Arbitrary constant naming this project's migration lock among other advisory locks of the database. */
const MIGRATION_LOCK = 727_001;
