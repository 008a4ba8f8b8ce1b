/**
 * The schema of both backends, as numbered steps described once (Kysely's schema builder speaks each dialect).
 * A database, or a store's SQLite file, records the versions it has in `schema_migrations` and gets only the
 * missing ones when it is opened; PostgreSQL runs every store's part of a step, a SQLite file its own store's.
 * Never edit a step that has shipped: add the next number. A step that adds a column asks first whether the table
 * has it: SQLite files made before this list existed were patched by hand, some of them already.
 */
import { sql } from 'kysely';
import type { ColumnDataType, ColumnDefinitionBuilder } from 'kysely';
import { COMMIT_MARKERS } from '../lib/postgres';
import type { Schema, StoreName } from './schema';
import type { Dialect, Sql } from './sql';

/** One numbered step of the schema. */
export interface Migration {
  version: number;
  name: string;
  /** What the step does to each store's tables, inside the step's transaction. */
  up: Partial<Record<StoreName, (db: Sql) => Promise<void>>>;
}

/** A column's type, by what it holds, in each dialect. */
interface Types {
  bytes: ColumnDataType;
  json: ColumnDataType;
  flag: ColumnDataType;
  /** A time SQLite keeps as epoch milliseconds. */
  time: ColumnDataType;
  /** A time SQLite keeps as ISO text (the publication file's columns). */
  timeText: ColumnDataType;
  bigint: ColumnDataType;
  /** A generated row number, as the primary key. */
  rowNumber: ColumnDataType;
  /** NOT NULL, and in PostgreSQL defaulted to now() (SQLite's stores always write the time). */
  stamped: (column: ColumnDefinitionBuilder) => ColumnDefinitionBuilder;
}

const TYPES: Record<Dialect, Types> = {
  postgres: {
    bytes: 'bytea',
    json: 'jsonb',
    flag: 'boolean',
    time: 'timestamptz',
    timeText: 'timestamptz',
    bigint: 'bigint',
    rowNumber: 'bigserial',
    stamped: (column) => column.notNull().defaultTo(sql`now()`),
  },
  sqlite: {
    bytes: 'blob',
    json: 'text',
    flag: 'integer',
    time: 'integer',
    timeText: 'text',
    bigint: 'integer',
    rowNumber: 'integer',
    stamped: (column) => column.notNull(),
  },
};

/** Adds a column unless the table has it already (see the top of this file). */
async function addColumn(db: Sql, table: keyof Schema, column: string, type: ColumnDataType): Promise<void> {
  if (!(await db.hasColumn(table, column)))
    await db.run(db.build.schema.alterTable(table).addColumn(column, type));
}

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: 'blobs, model memo, delivery ledger, publications',
    up: {
      async blobs(db) {
        const t = TYPES[db.dialect];
        await db.run(
          db.build.schema
            .createTable('blobs')
            .ifNotExists()
            .addColumn('ref', 'text', (c) => c.primaryKey())
            .addColumn('bytes', t.bytes, (c) => c.notNull())
            .addColumn('created_at', t.time, t.stamped),
        );
      },
      async memo(db) {
        const t = TYPES[db.dialect];
        await db.run(
          db.build.schema
            .createTable('model_memo')
            .ifNotExists()
            .addColumn('memo_key', 'text', (c) => c.primaryKey())
            .addColumn('workflow_id', 'text', (c) => c.notNull())
            .addColumn('step', 'text', (c) => c.notNull())
            .addColumn('request_hash', 'text', (c) => c.notNull())
            .addColumn('run_id', 'text', (c) => c.notNull())
            .addColumn('owner', 'text')
            .addColumn('lease_until', t.time)
            .addColumn('answer', t.json)
            .addColumn('provider_failures', 'integer', (c) => c.notNull().defaultTo(0))
            .addColumn('rejected', t.json, (c) => c.notNull().defaultTo('[]'))
            .addColumn('created_at', t.time, t.stamped)
            .addColumn('updated_at', t.time, t.stamped),
        );
        await db.run(
          db.build.schema
            .createIndex('model_memo_workflow_id')
            .ifNotExists()
            .on('model_memo')
            .column('workflow_id'),
        );
      },
      async ledger(db) {
        const t = TYPES[db.dialect];
        await db.run(
          db.build.schema
            .createTable('delivery_ledger')
            .ifNotExists()
            .addColumn('idempotency_key', 'text', (c) => c.primaryKey())
            .addColumn('workflow_id', 'text', (c) => c.notNull())
            .addColumn('document_id', 'text', (c) => c.notNull())
            .addColumn('state', 'text', (c) =>
              c.notNull().check(sql`state IN ('claimed', 'delivered', 'unsent')`),
            )
            .addColumn('owner', 'text')
            .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
            .addColumn('receipt', t.json)
            .addColumn('receiver_echoed_key', t.flag)
            .addColumn('last_error', 'text')
            .addColumn('created_at', t.time, t.stamped)
            .addColumn('updated_at', t.time, t.stamped),
        );
        await db.run(
          db.build.schema
            .createIndex('delivery_ledger_open')
            .ifNotExists()
            .on('delivery_ledger')
            .column('state')
            .where('state', '=', 'claimed'),
        );
      },
      async publications(db) {
        const t = TYPES[db.dialect];
        await db.run(
          db.build.schema
            .createTable('publications')
            .ifNotExists()
            .addColumn('document_id', 'text', (c) => c.primaryKey())
            .addColumn('revision', 'integer', (c) => c.notNull())
            .addColumn('title', 'text', (c) => c.notNull())
            .addColumn('summary', 'text', (c) => c.notNull())
            .addColumn('tags', t.json, (c) => c.notNull())
            .addColumn('updated_at', t.timeText, (c) => c.notNull())
            .addColumn('scheduled_at', t.bigint),
        );
        await db.run(
          db.build.schema
            .createTable('publication_revisions')
            .ifNotExists()
            .addColumn('document_id', 'text', (c) => c.notNull())
            .addColumn('revision', 'integer', (c) => c.notNull())
            .addColumn('idempotency_key', 'text', (c) => c.notNull().unique())
            .addColumn('payload', t.json, (c) => c.notNull())
            .addColumn('published_at', t.timeText, (c) => c.notNull())
            .addPrimaryKeyConstraint('publication_revisions_pkey', ['document_id', 'revision']),
        );
        await db.run(
          db.build.schema
            .createTable('publication_deliveries')
            .ifNotExists()
            .addColumn('id', t.rowNumber, (c) =>
              db.dialect === 'sqlite' ? c.primaryKey().autoIncrement() : c.primaryKey(),
            )
            .addColumn('idempotency_key', 'text', (c) => c.notNull())
            .addColumn('document_id', 'text', (c) => c.notNull())
            .addColumn('outcome', 'text', (c) => c.notNull())
            .addColumn('received_at', t.timeText, (c) => c.notNull()),
        );
      },
    },
  },
  {
    version: 2,
    name: 'the origin of the receiver that echoed a delivery key',
    up: {
      // Rows from before name no receiver: none of their echoes is trusted.
      ledger: (db) => addColumn(db, 'delivery_ledger', 'echoed_by', 'text'),
    },
  },
  {
    version: 3,
    name: "the version a delivery publishes, so a later run finds an earlier run's open claim on it",
    up: {
      async ledger(db) {
        // Claims from before match no other run's.
        await addColumn(db, 'delivery_ledger', 'text_ref', 'text');
        await db.run(
          db.build.schema
            .createIndex('delivery_ledger_open_version')
            .ifNotExists()
            .on('delivery_ledger')
            .columns(['document_id', 'text_ref'])
            .where(sql.ref('state'), '=', 'claimed'),
        );
      },
    },
  },
  {
    version: 4,
    name: 'the order of publications, in SQLite files made before it (PostgreSQL had it from the start)',
    up: {
      // NULL: a publication from before the order, which any new key may follow.
      publications: (db) => addColumn(db, 'publications', 'scheduled_at', TYPES[db.dialect].bigint),
    },
  },
  {
    version: 5,
    name: 'pacing of model calls for the whole fleet, and budgets of tokens and dollars',
    up: {
      async memo(db) {
        const t = TYPES[db.dialect];
        const float = db.dialect === 'postgres' ? 'double precision' : 'real';
        await db.run(
          db.build.schema
            .createTable('model_limits')
            .ifNotExists()
            .addColumn('scope', 'text', (c) => c.primaryKey())
            .addColumn('state', t.json, (c) => c.notNull())
            .addColumn('updated_at', t.time, t.stamped),
        );
        await db.run(
          db.build.schema
            .createTable('model_call_holds')
            .ifNotExists()
            .addColumn('hold_key', 'text', (c) => c.notNull())
            .addColumn('nonce', 'text', (c) => c.notNull())
            .addColumn('scope', 'text', (c) => c.notNull())
            .addColumn('budget_id', 'text')
            .addColumn('tokens', t.bigint, (c) => c.notNull())
            .addColumn('usd', float, (c) => c.notNull())
            .addColumn('start_at', t.bigint, (c) => c.notNull())
            .addColumn('lease_until', t.bigint, (c) => c.notNull())
            .addColumn('ended', t.flag, (c) => c.notNull().defaultTo(db.dialect === 'postgres' ? false : 0))
            .addPrimaryKeyConstraint('model_call_holds_pkey', ['hold_key', 'nonce']),
        );
        await db.run(
          db.build.schema
            .createIndex('model_call_holds_scope_start')
            .ifNotExists()
            .on('model_call_holds')
            .columns(['scope', 'start_at']),
        );
        await db.run(
          db.build.schema
            .createIndex('model_call_holds_budget')
            .ifNotExists()
            .on('model_call_holds')
            .column('budget_id'),
        );
        await db.run(
          db.build.schema
            .createTable('model_budgets')
            .ifNotExists()
            .addColumn('budget_id', 'text', (c) => c.primaryKey())
            .addColumn('limit_tokens', t.bigint)
            .addColumn('limit_usd', float)
            .addColumn('spent_tokens', t.bigint, (c) => c.notNull().defaultTo(0))
            .addColumn('spent_usd', float, (c) => c.notNull().defaultTo(0))
            .addColumn('created_at', t.time, t.stamped)
            .addColumn('updated_at', t.time, t.stamped),
        );
        await db.run(
          db.build.schema
            .createTable('model_budget_waiters')
            .ifNotExists()
            .addColumn('budget_id', 'text', (c) => c.notNull())
            .addColumn('workflow_id', 'text', (c) => c.notNull())
            .addColumn('since', t.time, t.stamped)
            .addPrimaryKeyConstraint('model_budget_waiters_pkey', ['budget_id', 'workflow_id']),
        );
      },
    },
  },
  {
    version: 6,
    name: 'markers of committed transactions, so a retry after a lost answer to COMMIT runs nothing twice',
    up: {
      // PostgreSQL only (lib/postgres.ts writes them), and it runs every store's part, so one part makes the table
      // for all. A SQLite file is written in this process: the answer to its COMMIT is never lost on the way.
      async memo(db) {
        if (db.dialect !== 'postgres') return;
        await db.run(
          db.build.schema
            .createTable(COMMIT_MARKERS)
            .ifNotExists()
            .addColumn('id', 'uuid', (c) => c.primaryKey())
            .addColumn('result', 'text')
            .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`)),
        );
        await db.run(
          db.build.schema
            .createIndex(`${COMMIT_MARKERS}_created_at`)
            .ifNotExists()
            .on(COMMIT_MARKERS)
            .column('created_at'),
        );
      },
    },
  },
  {
    version: 7,
    name: "the order of a delivery's run among its document's runs, so a newer version supersedes an older one",
    up: {
      // NULL: a delivery from before it, ordered by when its row was made.
      ledger: (db) => addColumn(db, 'delivery_ledger', 'scheduled_at', TYPES[db.dialect].bigint),
    },
  },
  {
    version: 8,
    name: "a publication's step fields in one JSON column, so the store names no step's result",
    up: {
      // `fields` is NOT NULL in both backends: a process of the version before, still running during an upgrade,
      // fails to write a publication without its fields (its retry, after the upgrade, writes it) instead of
      // writing one without them. The old columns stay, no longer required, for the rows written before.
      async publications(db) {
        if (db.dialect === 'postgres') {
          await addColumn(db, 'publications', 'fields', TYPES.postgres.json);
          await db.run(sql`UPDATE publications SET fields = jsonb_build_object('summary', summary, 'tags', tags)
            WHERE fields IS NULL`);
          await db.run(sql`ALTER TABLE publications ALTER COLUMN fields SET NOT NULL,
            ALTER COLUMN summary DROP NOT NULL, ALTER COLUMN tags DROP NOT NULL`);
          return;
        }
        // SQLite cannot drop a NOT NULL in place, so the table is made again, as SQLite's manual does it
        // (sqlite.org/lang_altertable.html, "other kinds of table schema changes"), and it is safe here: the step's
        // transaction holds the file's write lock, so the copy, the drop and the rename commit together or not at
        // all; no index, trigger, view or foreign key names the table; and another process's statements on it are
        // prepared again by SQLite when it sees the schema changed. Neutral values in the old columns would have
        // kept them required instead, for every publication to come.
        const t = TYPES.sqlite;
        await db.run(
          db.build.schema
            .createTable('publications_new')
            .addColumn('document_id', 'text', (c) => c.primaryKey())
            .addColumn('revision', 'integer', (c) => c.notNull())
            .addColumn('title', 'text', (c) => c.notNull())
            .addColumn('summary', 'text')
            .addColumn('tags', t.json)
            .addColumn('fields', t.json, (c) => c.notNull())
            .addColumn('updated_at', t.timeText, (c) => c.notNull())
            .addColumn('scheduled_at', t.bigint),
        );
        await db.run(sql`INSERT INTO publications_new
            (document_id, revision, title, summary, tags, fields, updated_at, scheduled_at)
          SELECT document_id, revision, title, summary, tags, json_object('summary', summary, 'tags', json(tags)),
            updated_at, scheduled_at
          FROM publications`);
        await db.run(sql`DROP TABLE publications`);
        await db.run(sql`ALTER TABLE publications_new RENAME TO publications`);
      },
    },
  },
  {
    version: 9,
    name: 'claims of provider batches (bulk mode), each made before its batch is created',
    up: {
      async memo(db) {
        const t = TYPES[db.dialect];
        await db.run(
          db.build.schema
            .createTable('bulk_claims')
            .ifNotExists()
            .addColumn('claim_key', 'text', (c) => c.primaryKey())
            .addColumn('batch_id', 'text', (c) => c.notNull())
            .addColumn('round', 'integer', (c) => c.notNull())
            .addColumn('provider', 'text', (c) => c.notNull())
            .addColumn('requests', t.json, (c) => c.notNull())
            .addColumn('provider_batch_id', 'text', (c) => c.unique())
            .addColumn('collected', t.json)
            .addColumn('created_at', t.time, t.stamped)
            .addColumn('updated_at', t.time, t.stamped),
        );
        await db.run(
          db.build.schema
            .createIndex('bulk_claims_batch')
            .ifNotExists()
            .on('bulk_claims')
            .columns(['batch_id', 'round']),
        );
      },
    },
  },
  {
    version: 10,
    name: "a call's worst case held against its budget, and whether it was sent, so a lapsed hold is charged",
    up: {
      // NULL budget_tokens (rows from before): the pacing's tokens stand for it. NULL sent_at: not let go yet.
      async memo(db) {
        const t = TYPES[db.dialect];
        await addColumn(db, 'model_call_holds', 'budget_tokens', t.bigint);
        await addColumn(db, 'model_call_holds', 'sent_at', t.bigint);
      },
    },
  },
  {
    version: 11,
    name: "an agent step's checkpoints: each turn's conversation as sent, each tool call's output",
    up: {
      async memo(db) {
        const t = TYPES[db.dialect];
        await db.run(
          db.build.schema
            .createTable('agent_checkpoints')
            .ifNotExists()
            .addColumn('checkpoint_key', 'text', (c) => c.primaryKey())
            .addColumn('workflow_id', 'text', (c) => c.notNull())
            .addColumn('step', 'text', (c) => c.notNull())
            .addColumn('body', t.json, (c) => c.notNull())
            .addColumn('chars', 'integer', (c) => c.notNull())
            .addColumn('created_at', t.time, t.stamped),
        );
        await db.run(
          db.build.schema
            .createIndex('agent_checkpoints_workflow_id')
            .ifNotExists()
            .on('agent_checkpoints')
            .column('workflow_id'),
        );
      },
    },
  },
];
