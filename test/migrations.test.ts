/**
 * The schema's numbered migrations, on both backends: a PostgreSQL database and a store's SQLite file record what
 * they have in `schema_migrations` and get each missing step once, however many processes open them together. And
 * what users already have upgrades in place: SQLite files made by the code before migrations (every shape its
 * hand-written ALTERs met, from the DDL of those commits, test/fixtures/schema-before-migrations.ts), and a
 * PostgreSQL database made by the SQL migrations 1 to 3 as shipped, each with rows in it that come through intact.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { sql } from 'kysely';
import { z } from 'zod';
import type { Database as Postgres } from '../src/lib/postgres';
import type { AnswerMemo } from '../src/model/memo';
import type { DeliveryLedger } from '../src/publisher/ledger';
import { SqlAnswerMemo, SqliteAnswerMemo } from '../src/model/memo-store';
import { SqlDeliveryLedger, SqliteDeliveryLedger } from '../src/publisher/ledger-store';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { migrate } from '../src/store/migrate';
import { MIGRATIONS } from '../src/store/migrations';
import type { Migration } from '../src/store/migrations';
import type { StoreName } from '../src/store/schema';
import type { Sql } from '../src/store/sql';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import { openSqlite } from '../src/store/sql-sqlite';
import * as before from './fixtures/schema-before-migrations';
import { freshDatabase } from './postgres';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
const ALL_VERSIONS = MIGRATIONS.map((m) => m.version);
const RECEIVER = 'https://receiver.example';

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
    return async () => postgresSql(ended(await openPostgres(url, [])));
  },
  async prepare(migrations) {
    ended(await openPostgres(await freshDatabase(defer), migrations));
  },
};

function closedAfterwards(db: Sql): Sql {
  defer(() => db.close());
  return db;
}

function ended(pool: Postgres): Postgres {
  defer(() => pool.end());
  return pool;
}

async function versions(db: Sql): Promise<number[]> {
  const rows = await db.rows(db.build.selectFrom('schema_migrations').select('version').orderBy('version'));
  return rows.map((row) => row.version);
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
      assert.deepEqual(applied.flat().sort(), ALL_VERSIONS, 'each version applied by exactly one of the two');
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

// ---------------------------------------------------------------------------------------------------------------
// What users have: SQLite files from before migrations, a PostgreSQL database from the shipped SQL
// ---------------------------------------------------------------------------------------------------------------

/** A SQLite file made by `ddl`, with `rows` inserted, as an earlier commit left it. */
function oldFile(name: string, ddl: string, rows: string): string {
  const file = path.join(scratchDir(defer, 'migrations-test-'), name);
  const db = new Database(file);
  db.exec(ddl);
  db.exec(rows);
  db.close();
  return file;
}

/** What a SQLite file holds, to compare an upgraded file with a fresh one: columns, indexes, versions. */
function shapeOf(file: string): unknown {
  const db = new Database(file, { readonly: true });
  try {
    const tables = db
      .prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
      )
      .pluck()
      .all();
    return {
      columns: tables.map((table) =>
        db
          .prepare(
            'SELECT name, upper(type) AS type, "notnull", dflt_value, pk FROM pragma_table_info(?) ORDER BY name',
          )
          .all(table),
      ),
      indexes: db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name")
        .pluck()
        .all(),
      versions: db.prepare('SELECT version FROM schema_migrations ORDER BY version').pluck().all(),
    };
  } finally {
    db.close();
  }
}

const ANSWER = {
  value: 'an answer',
  usage: { inputTokens: 3, outputTokens: 2 },
  model: { provider: 'offline', model: 'm' },
};
const RECEIPT = { documentId: 'doc-old', revision: 1, duplicate: false };

/** The memo entry an old file or database holds answers a later run's claim. */
async function assertAnswered(memo: AnswerMemo): Promise<void> {
  const request = {
    memoKey: 'doc-old:summarize:h',
    workflowId: 'doc-old',
    runId: 'run-2',
    step: 'summarize',
    requestHash: 'h',
  };
  const claim = await memo.claim(request, 'owner', 60_000);
  assert.deepEqual(claim, { kind: 'answered', answer: ANSWER, rejected: [] });
}

/** The delivery an old file or database holds answers its key's claim with its receipt. */
async function assertDelivered(ledger: DeliveryLedger): Promise<void> {
  const delivery = {
    idempotencyKey: 'run-1:publish',
    workflowId: 'doc-old',
    documentId: 'doc-old',
    version: 'v',
    inFlightMs: 0,
  };
  assert.deepEqual(await ledger.claim(delivery, 'owner'), { kind: 'delivered', receipt: RECEIPT });
}

describe('SQLite files made before migrations', () => {
  it('upgrades a memo file, its answered entry intact', async () => {
    const file = oldFile(
      'memo.db',
      before.SQLITE_MEMO,
      `INSERT INTO model_memo (memo_key, workflow_id, step, request_hash, run_id, answer, created_at, updated_at)
       VALUES ('doc-old:summarize:h', 'doc-old', 'summarize', 'h', 'run-1', '${JSON.stringify(ANSWER)}', 1, 1)`,
    );
    const memo = new SqliteAnswerMemo(file);
    await assertAnswered(memo);
    assert.equal(await memo.count(), 1);
    await memo.close();
    assert.deepEqual(shapeOf(file), await freshShape('memo.db', (f) => new SqliteAnswerMemo(f)));
  });

  for (const [shape, ddl] of [
    ['the oldest ledger file (no echoed_by, no text_ref)', before.SQLITE_LEDGER_OLDEST],
    ['a ledger file with echoed_by but no text_ref', before.SQLITE_LEDGER_ECHOED_BY],
    ['a ledger file with both columns added by hand', before.SQLITE_LEDGER],
  ] as const) {
    it(`upgrades ${shape}, its deliveries intact`, async () => {
      const file = oldFile(
        'ledger.db',
        ddl,
        `INSERT INTO delivery_ledger (idempotency_key, workflow_id, document_id, state, owner, attempts, receipt,
           receiver_echoed_key, created_at, updated_at)
         VALUES ('run-1:publish', 'doc-old', 'doc-old', 'delivered', NULL, 1, '${JSON.stringify(RECEIPT)}', 1, 1, 1),
                ('run-0:publish', 'doc-older', 'doc-older', 'claimed', 'worker-0', 1, NULL, NULL, 2, 2)`,
      );
      const ledger = new SqliteDeliveryLedger(file);
      await assertDelivered(ledger);
      assert.deepEqual(
        (await ledger.openClaims()).map((e) => [e.idempotencyKey, e.owner]),
        [['run-0:publish', 'worker-0']],
      );
      // An echo recorded before echoes named their receiver is nobody's.
      assert.equal(await ledger.receiverHonoursKeys(RECEIVER), false);
      await ledger.close();
      assert.deepEqual(shapeOf(file), await freshShape('ledger.db', (f) => new SqliteDeliveryLedger(f)));
    });
  }

  for (const [shape, ddl] of [
    ['the oldest publication file (no scheduled_at)', before.SQLITE_PUBLICATIONS_OLDEST],
    ['a publication file with scheduled_at added by hand', before.SQLITE_PUBLICATIONS],
  ] as const) {
    it(`upgrades ${shape}, its publication intact, and orders from then on`, async () => {
      const file = oldFile(
        'publications.db',
        ddl,
        `INSERT INTO publications (document_id, revision, title, summary, tags, updated_at)
           VALUES ('doc-old', 1, 'A title', 'Old.', '["a"]', '2025-01-01T00:00:00.000Z');
         INSERT INTO revisions VALUES ('doc-old', 1, 'run-1:publish', '{}', '2025-01-01T00:00:00.000Z');
         INSERT INTO deliveries (idempotency_key, document_id, outcome, received_at)
           VALUES ('run-1:publish', 'doc-old', 'created', '2025-01-01T00:00:00.000Z');`,
      );
      const store = new SqlitePublicationStore(file);
      assert.deepEqual(await store.currentPublication('doc-old'), {
        documentId: 'doc-old',
        revision: 1,
        title: 'A title',
        summary: 'Old.',
        tags: ['a'],
        scheduledAt: null,
      });
      const publication = (summary: string, scheduledAt: number) => ({
        documentId: 'doc-old',
        title: 'A title',
        textRef: `sha256:${'0'.repeat(64)}`,
        summary,
        tags: [],
        model: ANSWER.model,
        scheduledAt,
      });
      assert.deepEqual(await store.publish(publication('Old.', 1), 'run-1:publish'), {
        ...RECEIPT,
        duplicate: true,
      });
      assert.deepEqual(await store.publish(publication('Newer.', 2000), 'run-3:publish'), {
        ...RECEIPT,
        revision: 2,
      });
      assert.deepEqual(await store.publish(publication('Older.', 1000), 'run-2:publish'), {
        ...RECEIPT,
        revision: 2,
        superseded: true,
      });
      assert.deepEqual(
        (await store.deliveries()).map((d) => d.outcome),
        ['created', 'duplicate', 'created', 'stale'],
      );
      await store.close();
      assert.deepEqual(
        shapeOf(file),
        await freshShape('publications.db', (f) => new SqlitePublicationStore(f)),
      );
    });
  }
});

/** The shape of a file a store made from nothing. */
async function freshShape(
  name: string,
  open: (file: string) => { close(): Promise<void> },
): Promise<unknown> {
  const file = path.join(scratchDir(defer, 'migrations-test-'), name);
  await open(file).close();
  return shapeOf(file);
}

describe('a PostgreSQL database made by the shipped SQL migrations 1 to 3', () => {
  /** Columns, indexes and constraints of the database's tables, to compare two databases. */
  async function shape(db: Sql): Promise<unknown> {
    const rows = async (query: ReturnType<typeof sql>) => db.rows(query);
    return {
      columns: await rows(sql`SELECT table_name, column_name, data_type, is_nullable, column_default
        FROM information_schema.columns WHERE table_schema = 'public' ORDER BY table_name, column_name`),
      indexes: await rows(sql`SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
        ORDER BY indexname`),
      constraints: await rows(sql`SELECT conname, pg_get_constraintdef(oid) AS definition FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace ORDER BY conname`),
    };
  }

  it('keeps its versions and rows, gets the steps after them, and ends up as a fresh database', async () => {
    const url = await freshDatabase(defer);
    const shipped = postgresSql(ended(await openPostgres(url, [])));
    await shipped.run(sql.raw(before.POSTGRES_SCHEMA_MIGRATIONS));
    for (const step of before.POSTGRES_SHIPPED) {
      await shipped.run(sql.raw(step.sql));
      await shipped.run(
        sql`INSERT INTO schema_migrations (version, name) VALUES (${step.version}, ${step.name})`,
      );
    }
    await shipped.run(sql`INSERT INTO model_memo (memo_key, workflow_id, step, request_hash, run_id, answer)
      VALUES ('doc-old:summarize:h', 'doc-old', 'summarize', 'h', 'run-1', ${JSON.stringify(ANSWER)})`);
    await shipped.run(sql`INSERT INTO delivery_ledger (idempotency_key, workflow_id, document_id, state, receipt,
      receiver_echoed_key, echoed_by) VALUES ('run-1:publish', 'doc-old', 'doc-old', 'delivered',
      ${JSON.stringify(RECEIPT)}, true, ${RECEIVER})`);

    const pool = ended(await openPostgres(url));
    const db = postgresSql(pool);
    assert.deepEqual(await versions(db), ALL_VERSIONS);
    const memo = new SqlAnswerMemo(db);
    await assertAnswered(memo);
    const ledger = new SqlDeliveryLedger(db);
    await assertDelivered(ledger);
    assert.equal(await ledger.receiverHonoursKeys(RECEIVER), true);

    const fresh = postgresSql(ended(await openPostgres(await freshDatabase(defer))));
    assert.deepEqual(await shape(db), await shape(fresh));
  });
});
