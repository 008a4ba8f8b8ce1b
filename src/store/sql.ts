/**
 * One way for the stores to reach either backend. Kysely builds each query (typed by schema.ts; the hot paths are
 * `sql` templates, see forUpdate) and compiles it to the backend's dialect; it never runs one: a SQLite handle runs it on its better-sqlite3 file (sql-sqlite.ts), a
 * PostgreSQL handle through the project's `Database` (sql-postgres.ts), whose outage retries, timeouts and error
 * listeners stay in force for every statement. So each store is written once; what differs between the dialects
 * (how a transaction holds its lock, the clock, JSON) is a method here, said once per backend.
 */
import {
  DummyDriver,
  sql,
  Kysely,
  OperationNodeTransformer,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  SqliteAdapter,
  SqliteIntrospector,
  SqliteQueryCompiler,
} from 'kysely';
import type {
  Compilable,
  CompiledQuery,
  KyselyPlugin,
  PluginTransformQueryArgs,
  PluginTransformResultArgs,
  QueryResult,
  RawBuilder,
  RootOperationNode,
  TableNode,
  UnknownRow,
} from 'kysely';
import type { Schema, WrittenTime } from './schema';

export type Dialect = 'sqlite' | 'postgres';

/** A query as the builder (or a `sql` template) gives it. */
export type Query<O> = Compilable<O> | RawBuilder<O>;

/** A connection to one backend, as every store uses it. */
export interface Sql {
  readonly dialect: Dialect;
  /** Where the rows are, for messages: the file, or PostgreSQL. */
  readonly where: string;
  /** Builds (never runs) queries in this backend's dialect. */
  readonly build: Kysely<Schema>;
  /**
   * The statements below, outside a transaction, commit each on its own. A write that PostgreSQL retries through an
   * outage runs as a transaction of one statement, committed once (see transaction), unless it was marked
   * safeToRepeat; a read is simply sent again.
   */
  rows<O>(query: Query<O>): Promise<O[]>;
  first<O>(query: Query<O>): Promise<O | undefined>;
  /** Runs a statement; returns the number of rows it changed. */
  run(query: Query<unknown>): Promise<number>;
  /**
   * Runs a statement whose commit need not outlive an OS crash of this machine (a caller says why). SQLite commits
   * it without an fsync (`synchronous=NORMAL` for that statement alone, outside a transaction): a kill of the
   * process keeps it, and the file's next synced commit makes it durable with its own. PostgreSQL commits it as
   * any other statement: there the writer and the database are different hosts, and one can fail alone.
   */
  runUnsynced(query: Query<unknown>): Promise<number>;
  /**
   * Runs a statement as `run` does, durable when the promise resolves, without holding up this thread while the
   * disk syncs. SQLite commits it unsynced and then fsyncs the file's write-ahead log from one of libuv's threads
   * (in a transaction, it commits with it); PostgreSQL runs it as `run`. Between the commit and the sync, another
   * process on the file may already read the row (a caller says what that can cost).
   */
  runSyncedAside(query: Query<unknown>): Promise<number>;
  /**
   * `work` in one transaction that holds the write lock it needs before it reads: SQLite's `BEGIN IMMEDIATE`
   * takes the file's only write lock, so two claimers serialise instead of both reading "free"; PostgreSQL locks
   * what the transaction reads with FOR UPDATE (see lockRows) or a named lock (see lock). Retried through an
   * outage on PostgreSQL, the whole transaction again, yet committed once: a retry after a lost answer to COMMIT
   * returns what the committed try returned (so the result must survive JSON; dates and bytes do), unless
   * `safeToRepeat` says running the work twice changes nothing (see lib/postgres.ts). With `syncAside`, durable
   * when the promise resolves as runSyncedAside's statement is: other work on the file goes on while the disk syncs.
   */
  transaction<T>(
    work: (tx: Sql) => Promise<T>,
    options?: { syncAside?: boolean; safeToRepeat?: boolean },
  ): Promise<T>;
  /**
   * Resolves once every commit this handle could read so far is on disk. SQLite: an fsync of the write-ahead log,
   * which carries the commits that runUnsynced and runSyncedAside made, by this process or another, so a row read
   * before it is durable after it; call it before acting on a row that some other writer may have committed the
   * moment before. PostgreSQL: nothing to do, a commit is flushed before any other session sees it.
   */
  syncCommitted(): Promise<void>;
  /**
   * Inside a transaction, waits for and holds a lock on `key` until it ends, so transactions on one key take
   * turns. PostgreSQL: an advisory transaction lock (a number is used as is, a string hashed). SQLite: nothing
   * to do, the transaction already holds the file's write lock.
   */
  lock(key: number | string): Promise<void>;
  /** True where a read in a transaction must say FOR UPDATE to lock its rows (PostgreSQL, not SQLite). */
  readonly lockRows: boolean;
  /**
   * The time now, to write: PostgreSQL's transaction time (`now()`); SQLite's epoch milliseconds, or ISO text
   * in the publication file's columns, which were text before PostgreSQL came.
   */
  now(as?: 'text'): RawBuilder<WrittenTime>;
  /** The time `offsetMs` from now on the backend's clock (PostgreSQL's `clock_timestamp()`): leases use it. */
  clock(offsetMs?: number): RawBuilder<WrittenTime>;
  /** A time to compare a column with: `date`, or `msAgo` before the backend's transaction time. */
  time(date: Date): Date | number;
  ago(msAgo: number): RawBuilder<Date | number>;
  /** `column` with one JSON value (as text) appended to the array it holds. */
  jsonAppend(column: string, json: string): RawBuilder<string>;
  /** True when `table` has `column` (a migration that adds one asks first: an old SQLite file may have it). */
  hasColumn(table: keyof Schema, column: string): Promise<boolean>;
  /** Ends what this handle owns: a SQLite file's connection; a PostgreSQL handle borrows its opener's pool. */
  close(): Promise<void>;
}

/**
 * The builder of one dialect: compiles only (a dummy driver), so no query runs behind the executors' back. With
 * `tableNames`, it writes those tables under the names given (every query is walked for them: a cost paid only by
 * the file whose tables have other names).
 */
export function builderFor(
  dialect: Dialect,
  tableNames?: Readonly<Partial<Record<keyof Schema, string>>>,
): Kysely<Schema> {
  const postgres = dialect === 'postgres';
  return new Kysely<Schema>({
    dialect: {
      createAdapter: () => (postgres ? new PostgresAdapter() : new SqliteAdapter()),
      createDriver: () => new DummyDriver(),
      createIntrospector: (db) => (postgres ? new PostgresIntrospector(db) : new SqliteIntrospector(db)),
      createQueryCompiler: () => (postgres ? new PostgresQueryCompiler() : new SqliteQueryCompiler()),
    },
    plugins: tableNames === undefined ? [] : [new RenameTables(tableNames)],
  });
}

/** Compiles a builder's query, or a `sql` template against `build`. */
export function compiled<O>(query: Query<O>, build: Kysely<Schema>): CompiledQuery<O> {
  return 'isRawBuilder' in query ? query.compile(build) : query.compile();
}

/** Writes each table under the name `names` gives it, wherever a query names it. */
class RenameTables implements KyselyPlugin {
  private readonly transformer: Renamer;

  constructor(names: Readonly<Partial<Record<string, string>>>) {
    this.transformer = new Renamer(names);
  }

  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    return this.transformer.transformNode(args.node);
  }

  transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    return Promise.resolve(args.result);
  }
}

class Renamer extends OperationNodeTransformer {
  constructor(private readonly names: Readonly<Partial<Record<string, string>>>) {
    super();
  }

  protected override transformTable(node: TableNode): TableNode {
    const table = super.transformTable(node);
    const name = this.names[table.table.identifier.name];
    if (name === undefined) return table;
    return { ...table, table: { ...table.table, identifier: { ...table.table.identifier, name } } };
  }
}

/**
 * ` FOR UPDATE` for a hot path's read. The hot paths (a memo claim and answer, a ledger claim, a publication) are
 * `sql` templates, not the builder: one text for both dialects, what differs put in by the handle (its clock,
 * this), rows typed by hand. The builder costs some 10 to 30 µs of CPU a statement to build and compile, which a
 * claim of four statements felt (bench/stores.ts, docs/backends.md); a template, 1 to 3 µs.
 */

/** ` FOR UPDATE` where a transaction's read must lock its rows (PostgreSQL); nothing in SQLite (see Sql.lockRows). */
export function forUpdate(db: Sql): RawBuilder<unknown> {
  return db.lockRows ? FOR_UPDATE : NOTHING;
}
const FOR_UPDATE = sql` FOR UPDATE`;
const NOTHING = sql.raw('');

/** How many keys one statement of a sweep names: far below either backend's limit on parameters. */
const SWEEP_BATCH = 500;

/**
 * Deletes the rows a sweep chose, by key, a batch at a time: `remove` deletes one batch and says how many rows it
 * deleted. A sweep lists, filters in code, then deletes (the same statements in both dialects), each DELETE
 * repeating the listing's conditions, so a row touched since it was listed stays.
 */
export async function removeInBatches(
  keys: readonly string[],
  remove: (batch: string[]) => Promise<number>,
): Promise<number> {
  let removed = 0;
  for (let i = 0; i < keys.length; i += SWEEP_BATCH) removed += await remove(keys.slice(i, i + SWEEP_BATCH));
  return removed;
}

/**
 * A sweep of rows kept for a workflow (the memo's, the ledger's): lists them with `listed`, keeps those whose
 * workflow is not open, and deletes those by key with `removal`, a batch at a time (see removeInBatches).
 */
export async function sweepClosedWorkflows(
  db: Sql,
  openWorkflowIds: ReadonlySet<string>,
  listed: Query<{ key: string; workflow_id: string }>,
  removal: (keys: string[]) => Query<unknown>,
): Promise<number> {
  const rows = await db.rows(listed);
  const keys = rows.filter((row) => !openWorkflowIds.has(row.workflow_id)).map((row) => row.key);
  return removeInBatches(keys, (batch) => db.run(removal(batch)));
}

const REPEATABLE = new WeakSet<object>();

/**
 * Marks a write that is safe to repeat as it is: run again after it committed, it changes nothing and answers the
 * same (an insert that does nothing on conflict and whose caller reads on, an update that sets what it set again).
 * PostgreSQL then sends it again after an outage as a read is, without the marker a checked write commits with (a
 * hot path spares three round trips). A caller says why it is safe; anything else is left unmarked.
 */
export function safeToRepeat<Q extends Query<unknown>>(query: Q): Q {
  REPEATABLE.add(query);
  return query;
}

/** True for a read, or a write marked safeToRepeat: PostgreSQL sends it again after an outage without a check. */
export function isSafeToRepeat(query: Query<unknown>, text: string): boolean {
  return REPEATABLE.has(query) || /^\s*SELECT\b/i.test(text);
}

/** A time column as read: a Date (PostgreSQL), epoch milliseconds or ISO text (SQLite). */
export function dateOf(value: Date | number | string): Date {
  return value instanceof Date ? value : new Date(value);
}

/** A JSON column as read: parsed already (PostgreSQL's jsonb), or text (SQLite). */
export function jsonOf(value: unknown): unknown {
  return typeof value === 'string' ? (JSON.parse(value) as unknown) : value;
}

/** A boolean as read: true/false (PostgreSQL), 1/0 (SQLite). */
export function flagOf(value: unknown): boolean {
  return value === true || value === 1;
}

/** Marks an expression as one of the backend's times, for a time column. */
export function written(expression: RawBuilder<unknown>): RawBuilder<WrittenTime> {
  return expression.$castTo<WrittenTime>();
}
