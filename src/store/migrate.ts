import { sql } from 'kysely';
import type { Migration } from './migrations';
import type { StoreName } from './schema';
import type { Sql } from './sql';

const ALL_STORES: readonly StoreName[] = ['blobs', 'memo', 'ledger', 'publications'];

/**
 * Applies the migrations not yet recorded in `schema_migrations`, each in its own transaction, in version order,
 * running each one's steps for `stores` (PostgreSQL holds every store; a SQLite file one). Every transaction
 * first takes the migration lock (PostgreSQL: the advisory lock the project has always used; SQLite: the file's
 * write lock) and looks again, so processes starting together take turns and each step runs once; for the same
 * reason a transaction repeated after a lost answer to its COMMIT finds its step done and does nothing (they are
 * safe to repeat, and must be: the first ones run before the table of commit markers exists). Returns the versions
 * this call applied (one whose COMMIT's answer was lost is not among them).
 */
export async function migrate(
  db: Sql,
  migrations: readonly Migration[],
  stores: readonly StoreName[] = ALL_STORES,
): Promise<number[]> {
  const recorded = await db.transaction(async (tx) => {
    await tx.lock(MIGRATION_LOCK);
    await tx.run(
      tx.build.schema
        .createTable('schema_migrations')
        .ifNotExists()
        .addColumn('version', 'integer', (c) => c.primaryKey())
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('applied_at', tx.dialect === 'postgres' ? 'timestamptz' : 'integer', (c) =>
          tx.dialect === 'postgres' ? c.notNull().defaultTo(sql`now()`) : c.notNull(),
        ),
    );
    return tx.rows(tx.build.selectFrom('schema_migrations').select('version'));
  }, REPEATABLE);
  const have = new Set(recorded.map((row) => row.version));
  const applied: number[] = [];
  for (const migration of [...migrations].sort((a, b) => a.version - b.version)) {
    if (have.has(migration.version)) continue;
    const ran = await db
      .transaction(async (tx) => {
        await tx.lock(MIGRATION_LOCK);
        const done = await tx.first(
          tx.build.selectFrom('schema_migrations').select('version').where('version', '=', migration.version),
        );
        if (done !== undefined) return false;
        for (const store of stores) await migration.up[store]?.(tx);
        await tx.run(
          tx.build
            .insertInto('schema_migrations')
            .values({ version: migration.version, name: migration.name, applied_at: tx.now() }),
        );
        return true;
      }, REPEATABLE)
      .catch((err: unknown) => {
        throw new Error(`migration ${migration.version} (${migration.name}) failed`, { cause: err });
      });
    if (ran) applied.push(migration.version);
  }
  return applied;
}

const REPEATABLE = { safeToRepeat: true };

/** Arbitrary constant naming this project's migration lock among other advisory locks of the database. */
const MIGRATION_LOCK = 727_001;
