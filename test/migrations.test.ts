/**
 * The schema's numbered migrations, on both backends: a PostgreSQL database and a store's SQLite file record what
 * they have in `schema_migrations` and get each missing step once, however many processes open them together. What
 * users already have (files and databases from before) upgrading: schema-upgrade.test.ts.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { describe, it } from 'node:test';
import { sql } from 'kysely';
import { z } from 'zod';
import { migrate } from '../src/store/migrate';
import { MIGRATIONS } from '../src/store/migrations';
import type { Migration } from '../src/store/migrations';
import type { StoreName } from '../src/store/schema';
import type { Sql } from '../src/store/sql';
import { openSqlite } from '../src/store/sql-sqlite';
import { freshDatabase } from './postgres';
import { openedPostgres, versions } from './schema';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
const ALL_VERSIONS = MIGRATIONS.map((m) => m.version);

/** One backend as the migrations see it: handles on one fresh location, migrated only when a test says so. */
interface Backend {
  name: string;
  /** A fresh location, and a way to open another handle on it (another process, as far as locks go). */
  fresh(): Promise<() => Promise<Sql>>;
  /** Opens the fresh location with `migrations` the way the stores do, resolving once they have run. */
  prepare(migrations: readonly Migration[]): Promise<void>;
}

const sqliteFile: Backend = {
  name: 'a SQLite file',
  async fresh() {
    const file = path.join(scratchDir(defer, 'migrations-test-'), 'memo.db');
    return () => Promise.resolve(closedAfterwards(openSqlite(file, 'memo', [])));
  },
  async prepare(migrations) {
    const file = path.join(scratchDir(defer, 'migrations-test-'), 'memo.db');
    const db = closedAfterwards(openSqlite(file, 'memo', migrations));
    await db.first(sql`SELECT 1`);
  },
};

const postgres: Backend = {
  name: 'PostgreSQL',
  async fresh() {
    const url = await freshDatabase(defer);
    return async () => openedPostgres(defer, url, []);
  },
  async prepare(migrations) {
    await openedPostgres(defer, await freshDatabase(defer), migrations);
  },
};

function closedAfterwards(db: Sql): Sql {
  defer(() => db.close());
  return db;
}

/** A table's existence, in either dialect. */
async function tableExists(db: Sql, table: string): Promise<boolean> {
  const found = await db.first(
    db.dialect === 'sqlite'
      ? sql`SELECT 1 AS yes FROM sqlite_master WHERE type = 'table' AND name = ${table}`
      : sql`SELECT 1 AS yes WHERE to_regclass(${table}) IS NOT NULL`,
  );
  return found !== undefined;
}

/** A step creating `table` in the memo's file (PostgreSQL runs every store's part). */
function creates(version: number, table: string, then?: (db: Sql) => Promise<void>): Migration {
  return {
    version,
    name: then === undefined ? 'a table' : 'a broken step',
    up: {
      async memo(db) {
        await db.run(sql`CREATE TABLE ${sql.table(table)} (id integer)`);
        await then?.(db);
      },
    },
  };
}

const fails = async (db: Sql): Promise<void> => {
  await db.run(sql`SELECT * FROM no_such_table`);
};
const MEMO_ONLY: readonly StoreName[] = ['memo'];

for (const backend of [sqliteFile, postgres]) {
  describe(`migrations on ${backend.name}`, () => {
    const stores = backend === sqliteFile ? MEMO_ONLY : undefined;

    it('records every version when it prepares a database', async () => {
      const open = await backend.fresh();
      const db = await open();
      assert.deepEqual(await migrate(db, MIGRATIONS, stores), ALL_VERSIONS);
      assert.deepEqual(await versions(db), ALL_VERSIONS);
    });

    it('applies each migration once, however many processes open the database together', async () => {
      const open = await backend.fresh();
      const [a, b] = [await open(), await open()];
      const applied = await Promise.all([migrate(a, MIGRATIONS, stores), migrate(b, MIGRATIONS, stores)]);
      assert.deepEqual(
        applied.flat().sort((x, y) => x - y),
        ALL_VERSIONS,
        'each version applied by exactly one of the two',
      );
      assert.deepEqual(await migrate(await open(), MIGRATIONS, stores), [], 'a migration ran again');
      assert.deepEqual(await versions(a), ALL_VERSIONS);
    });

    it('rolls a failing migration back and names it in the error', async () => {
      const db = await (await backend.fresh())();
      const works = creates(1, 'first_table');
      const broken = creates(2, 'half_done', fails);
      await assert.rejects(migrate(db, [works, broken], stores), {
        message: 'migration 2 (a broken step) failed',
      });
      assert.deepEqual(await versions(db), [1]);
      assert.equal(await tableExists(db, 'first_table'), true);
      assert.equal(await tableExists(db, 'half_done'), false, 'the failed migration was not rolled back');
      assert.deepEqual(await migrate(db, [works, creates(2, 'half_done')], stores), [2]);
    });

    it('names the failing migration when opening a database fails', async () => {
      await assert.rejects(backend.prepare([creates(1, 'half_done', fails)]), {
        message:
          /(could not be prepared|could not be brought up to date): migration 1 \(a broken step\) failed/,
      });
    });
  });
}

describe('migrations of one SQLite file by processes starting together', () => {
  it('applies each migration in exactly one of them', async () => {
    const file = path.join(scratchDir(defer, 'migrations-test-'), 'ledger.db');
    const children = Array.from({ length: 3 }, () => migratingProcess(file));
    await Promise.all(children.map((child) => child.ready));
    for (const child of children) child.go();
    const applied = await Promise.all(children.map((child) => child.applied));
    assert.deepEqual(
      applied.flat().sort((a, b) => a - b),
      [...ALL_VERSIONS, 1_000],
      `each version applied by exactly one process: ${JSON.stringify(applied)}`,
    );
  });
});

/** test/fixtures/migrate-sqlite-file.ts on `file`, killed after the file's tests, and its answers. */
function migratingProcess(file: string): { ready: Promise<void>; go(): void; applied: Promise<number[]> } {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', path.join(__dirname, 'fixtures', 'migrate-sqlite-file.ts'), file],
    {
      stdio: ['pipe', 'pipe', 'inherit'],
    },
  );
  defer(() => {
    child.kill('SIGKILL');
  });
  const lines = createInterface({ input: child.stdout });
  const next = (): Promise<string> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error('the migrating process said nothing for 60 s')),
        60_000,
      );
      lines.once('line', (line) => {
        clearTimeout(timer);
        resolve(line);
      });
      child.once('exit', (code) => reject(new Error(`the migrating process exited (${code ?? 'signal'})`)));
    });
  const ready = next().then((line) => {
    assert.equal(line, 'ready');
  });
  const applied = ready.then(async () => z.array(z.number()).parse(JSON.parse(await next())));
  applied.catch(() => undefined);
  return { ready, go: () => child.stdin.write('go\n'), applied };
}
