/** What the schema's tests (migrations.test.ts, schema-upgrade.test.ts) share. */
import type { Migration } from '../src/store/migrations';
import type { Sql } from '../src/store/sql';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import type { Defer } from './scratch';

/** The database at `url` opened as the stores open it (with `migrations`), its pool ended after the file's tests. */
export async function openedPostgres(
  defer: Defer,
  url: string,
  migrations?: readonly Migration[],
): Promise<Sql> {
  const pool = await openPostgres(url, migrations);
  defer(() => pool.end());
  return postgresSql(pool);
}

/** The versions `db` records as applied, in order. */
export async function versions(db: Sql): Promise<number[]> {
  const rows = await db.rows(db.build.selectFrom('schema_migrations').select('version').orderBy('version'));
  return rows.map((row) => row.version);
}
