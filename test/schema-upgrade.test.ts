/**
 * What users already have upgrades in place: SQLite files made by the code before migrations (every shape its
 * hand-written ALTERs met, from the DDL of those commits: fixtures/schema-before-migrations.ts) and a PostgreSQL
 * database made by the SQL migrations 1 to 3 as shipped, each with rows in it that come through intact, ending
 * up as a fresh file or database would be. The migrations themselves: migrations.test.ts.
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { sql } from 'kysely';
import type { AnswerMemo } from '../src/model/memo';
import { SqlAnswerMemo, SqliteAnswerMemo } from '../src/model/memo-store';
import type { DeliveryLedger } from '../src/publisher/ledger';
import { SqlDeliveryLedger, SqliteDeliveryLedger } from '../src/publisher/ledger-store';
import { SqlitePublicationStore, SqlPublicationStore } from '../src/publisher/publication-store';
import type { PublicationStore } from '../src/publisher/publication-store';
import { MIGRATIONS } from '../src/store/migrations';
import type { Sql } from '../src/store/sql';
import { openSqlite } from '../src/store/sql-sqlite';
import * as before from './fixtures/schema-before-migrations';
import { freshDatabase } from './postgres';
import { openedPostgres, versions } from './schema';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
const ALL_VERSIONS = MIGRATIONS.map((m) => m.version);
const RECEIVER = 'https://receiver.example';

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

/** A publication as a store wrote it before migration 8: its step fields in the columns `summary` and `tags`. */
const OLD_PUBLICATION = sql`INSERT INTO publications (document_id, revision, title, summary, tags, updated_at,
  scheduled_at) VALUES ('doc-old', 3, 'A title', 'Old.', ${'["a","b"]'}, '2025-01-01T00:00:00.000Z', 1000)`;

/**
 * OLD_PUBLICATION reads back with its step fields, and the document's next publication, which carries other step
 * fields and writes neither old column, follows it.
 */
async function assertOldPublication(store: PublicationStore): Promise<void> {
  const current = {
    documentId: 'doc-old',
    revision: 3,
    title: 'A title',
    scheduledAt: 1000,
    fields: { summary: 'Old.', tags: ['a', 'b'] },
  };
  assert.deepEqual(await store.currentPublication('doc-old'), current);
  const next = {
    documentId: 'doc-old',
    title: 'A title',
    textRef: `sha256:${'0'.repeat(64)}`,
    model: ANSWER.model,
    scheduledAt: 2000,
    headline: 'New.',
  };
  assert.deepEqual(await store.publish(next, 'run-4:publish'), { ...RECEIPT, revision: 4, changed: true });
  assert.deepEqual(await store.currentPublication('doc-old'), {
    ...current,
    revision: 4,
    scheduledAt: 2000,
    fields: { headline: 'New.' },
  });
}

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
        scheduledAt: null,
        fields: { summary: 'Old.', tags: ['a'] },
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
        changed: true,
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
    const shipped = await openedPostgres(defer, url, []);
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
    await shipped.run(OLD_PUBLICATION);

    const db = await openedPostgres(defer, url);
    assert.deepEqual(await versions(db), ALL_VERSIONS);
    const memo = new SqlAnswerMemo(db);
    await assertAnswered(memo);
    const ledger = new SqlDeliveryLedger(db);
    await assertDelivered(ledger);
    assert.equal(await ledger.receiverHonoursKeys(RECEIVER), true);
    await assertOldPublication(new SqlPublicationStore(db));

    const fresh = await openedPostgres(defer, await freshDatabase(defer));
    assert.deepEqual(await shape(db), await shape(fresh));
  });
});

describe('publications written before their step fields had a column (migration 8)', () => {
  const BEFORE_8 = MIGRATIONS.filter((m) => m.version < 8);

  it('reads a row of a SQLite file at version 7 back with its fields', async () => {
    const file = path.join(scratchDir(defer, 'migrations-test-'), 'publications.db');
    const at7 = openSqlite(file, 'publications', BEFORE_8);
    await at7.run(OLD_PUBLICATION);
    await at7.close();
    const store = new SqlitePublicationStore(file);
    await assertOldPublication(store);
    await store.close();
    assert.deepEqual(
      shapeOf(file),
      await freshShape('publications.db', (f) => new SqlitePublicationStore(f)),
    );
  });

  it('reads a row of a PostgreSQL database at version 7 back with its fields', async () => {
    const url = await freshDatabase(defer);
    const at7 = await openedPostgres(defer, url, BEFORE_8);
    await at7.run(OLD_PUBLICATION);
    const db = await openedPostgres(defer, url);
    assert.deepEqual(await versions(db), ALL_VERSIONS);
    await assertOldPublication(new SqlPublicationStore(db));
  });
});
