import fs from 'node:fs';
import path from 'node:path';
import type BetterSqlite3 from 'better-sqlite3';
import { CompiledQuery, sql } from 'kysely';
import type { Kysely } from 'kysely';
import { openDatabase } from '../lib/sqlite';
import { migrate } from './migrate';
import { MIGRATIONS } from './migrations';
import type { Migration } from './migrations';
import type { Schema, StoreName } from './schema';
import { SQLITE_TABLE_NAMES } from './schema';
import { builderFor, compiled, written } from './sql';
import type { Query, Sql } from './sql';

const CONTROL = {
  'BEGIN IMMEDIATE': CompiledQuery.raw('BEGIN IMMEDIATE'),
  COMMIT: CompiledQuery.raw('COMMIT'),
  ROLLBACK: CompiledQuery.raw('ROLLBACK'),
  UNSYNCED: CompiledQuery.raw('PRAGMA synchronous = NORMAL'),
  SYNCED: CompiledQuery.raw('PRAGMA synchronous = FULL'),
};
const plainBuilder = builderFor('sqlite');
/** The publication file's builder: two of its tables have the names they had before PostgreSQL came. */
const renamingBuilder = builderFor('sqlite', SQLITE_TABLE_NAMES);

/**
 * Opens the SQLite file of one store (the durability settings of lib/sqlite.ts) and brings its schema up to date:
 * the migrations' steps for `store`'s tables, recorded in the file's own `schema_migrations`. The handle is ready
 * at once; its first statement waits for the migrations, and fails with their error if they failed.
 */
export function openSqlite(
  file: string,
  store: StoreName,
  migrations: readonly Migration[] = MIGRATIONS,
): Sql {
  const connection = Connection.of(file);
  const build = store === 'publications' ? renamingBuilder : plainBuilder;
  const ready = connection
    .exclusive(() => migrate(new SqliteSql(connection, build, 'direct', undefined), migrations, [store]))
    .then(
      () => undefined,
      (err: unknown) => {
        throw new Error(
          `the SQLite file ${file} could not be brought up to date: ${err instanceof Error ? err.message : String(err)}`,
          { cause: err },
        );
      },
    );
  // Every statement of the handle awaits it and sees the failure; nobody need await it for it to count as handled.
  ready.catch(() => undefined);
  return new SqliteSql(connection, build, 'queued', ready);
}

/**
 * The one better-sqlite3 connection of this process to a file, shared by every handle on it, its statements
 * prepared once each. The file is SQLite's to share between processes; within this one, work takes turns. Two
 * connections of one process must not share a file: a transaction here spans awaits, and a second connection's
 * BEGIN would wait for it synchronously, the event loop blocked, for the whole busy timeout.
 */
class Connection {
  private static readonly open = new Map<string, Connection>();
  readonly db: BetterSqlite3.Database;
  private readonly statements = new Map<string, BetterSqlite3.Statement>();
  private turn: Promise<void> = Promise.resolve();
  private handles = 0;
  private walMode: boolean | undefined;
  /** The sync level in force: lib/sqlite.ts opens the file with synchronous=FULL. */
  private syncLevel: 'SYNCED' | 'UNSYNCED' = 'SYNCED';
  private log: Promise<fs.promises.FileHandle> | undefined;

  /** The write-ahead log's path, fixed at open: the process may change its folder later. */
  private readonly walFile: string;

  private constructor(readonly file: string) {
    this.db = openDatabase(file);
    this.walFile = `${path.resolve(file)}-wal`;
  }

  /** The connection to `file`, opened if this process has none, counted as one more handle. */
  static of(file: string): Connection {
    const key = path.resolve(file);
    let connection = Connection.open.get(key);
    if (connection === undefined) {
      connection = new Connection(file);
      Connection.open.set(key, connection);
    }
    connection.handles += 1;
    return connection;
  }

  /**
   * Runs a statement. A write outside a transaction commits synced (synchronous=FULL); a read, or a statement inside
   * a transaction (which commits at the level its BEGIN was given, see level), runs at whatever level is in force.
   */
  exec(query: CompiledQuery<unknown>): { rows: unknown[]; changes: number } {
    const statement = this.prepared(query.sql);
    if (!statement.readonly && !this.db.inTransaction) this.level('SYNCED');
    return this.run(statement, query);
  }

  /**
   * `exec` committed without an fsync. The level is the connection's, and SQLite refuses to change it inside a
   * transaction: there the statement commits with the transaction, at the level the transaction began with.
   */
  execUnsynced(query: CompiledQuery<unknown>): { rows: unknown[]; changes: number } {
    if (!this.db.inTransaction) this.level('UNSYNCED');
    return this.run(this.prepared(query.sql), query);
  }

  /**
   * Sets the sync level for the commits that follow, outside a transaction. It is changed only when it differs:
   * the hot path (claims unsynced, answers and publications synced aside) then runs without a PRAGMA of its own,
   * where switching to NORMAL and back around each statement cost two statements more each time.
   */
  level(level: 'SYNCED' | 'UNSYNCED'): void {
    if (this.syncLevel === level) return;
    this.run(this.prepared(CONTROL[level].sql), CONTROL[level]);
    this.syncLevel = level;
  }

  private prepared(text: string): BetterSqlite3.Statement {
    let statement = this.statements.get(text);
    if (statement === undefined) {
      statement = this.db.prepare(text);
      if (this.statements.size >= 256) this.statements.clear();
      this.statements.set(text, statement);
    }
    return statement;
  }

  private run(
    statement: BetterSqlite3.Statement,
    query: CompiledQuery<unknown>,
  ): { rows: unknown[]; changes: number } {
    // better-sqlite3 binds numbers, strings, buffers and null; a flag is 0 or 1.
    const values = query.parameters.map((v) => (typeof v === 'boolean' ? Number(v) : v));
    if (statement.reader) {
      const rows = statement.all(...values);
      return { rows, changes: rows.length };
    }
    return { rows: [], changes: statement.run(...values).changes };
  }

  /** Whether the file keeps a write-ahead log (lib/sqlite.ts asks for one; some filesystems refuse it). */
  get inWalMode(): boolean {
    this.walMode ??= String(this.db.pragma('journal_mode', { simple: true })).toLowerCase() === 'wal';
    return this.walMode;
  }

  /**
   * fsyncs the write-ahead log from one of libuv's threads: every frame written to it so far (the last commit's and
   * any unsynced ones before it) is on disk when this resolves, as synchronous=FULL would have it, while the event
   * loop runs. The log keeps its file while a connection is open, so one descriptor serves until release.
   */
  async syncLog(): Promise<void> {
    const opening = (this.log ??= fs.promises.open(this.walFile, 'r'));
    let log: fs.promises.FileHandle;
    try {
      log = await opening;
    } catch (err) {
      if (this.log === opening) this.log = undefined;
      throw err;
    }
    await log.datasync();
  }

  /** A transaction's BEGIN IMMEDIATE, COMMIT or ROLLBACK, prepared once like every statement. */
  control(statement: 'BEGIN IMMEDIATE' | 'COMMIT' | 'ROLLBACK'): void {
    this.run(this.prepared(CONTROL[statement].sql), CONTROL[statement]);
  }

  /** Runs `work` once every earlier caller's work is done. */
  async exclusive<T>(work: () => T | Promise<T>): Promise<T> {
    const previous = this.turn;
    let done = (): void => undefined;
    this.turn = new Promise<void>((resolve) => (done = resolve));
    try {
      await previous;
      return await work();
    } finally {
      done();
    }
  }

  /** One handle fewer, once its work is done; the last one closes the file. */
  async release(): Promise<void> {
    await this.exclusive(() => undefined);
    this.handles -= 1;
    if (this.handles > 0) return;
    Connection.open.delete(path.resolve(this.file));
    const log = this.log;
    this.log = undefined;
    await log?.then((handle) => handle.close()).catch(() => undefined);
    this.db.close();
  }
}

/** A handle on the connection: `queued` takes turns with other callers; `direct` already has its turn. */
class SqliteSql implements Sql {
  readonly dialect = 'sqlite';
  readonly lockRows = false;

  private closed = false;

  constructor(
    private readonly connection: Connection,
    readonly build: Kysely<Schema>,
    private readonly mode: 'queued' | 'direct',
    /** A queued handle's migrations: its statements wait for them (they were queued before any of them). */
    private readonly ready: Promise<void> | undefined,
  ) {}

  get where(): string {
    return this.connection.file;
  }

  async rows<O>(query: Query<O>): Promise<O[]> {
    // The rows are what the statement returned, as its query (the builder, or a template by hand) typed them.
    return (await this.exec(query)).rows as O[];
  }

  async first<O>(query: Query<O>): Promise<O | undefined> {
    return (await this.rows(query))[0];
  }

  async run(query: Query<unknown>): Promise<number> {
    return (await this.exec(query)).changes;
  }

  async runUnsynced(query: Query<unknown>): Promise<number> {
    return (await this.exec(query, { synced: false })).changes;
  }

  async runSyncedAside(query: Query<unknown>): Promise<number> {
    if (!this.syncsAside) return this.run(query);
    const { changes } = await this.exec(query, { synced: false });
    // After its turn: the next statement need not wait for the disk, and this one's frames are in the log already.
    await this.connection.syncLog();
    return changes;
  }

  async transaction<T>(work: (tx: Sql) => Promise<T>, { syncAside = false } = {}): Promise<T> {
    const { db } = this.connection;
    const aside = syncAside && this.syncsAside;
    const transaction = async (): Promise<T> => {
      if (db.inTransaction) throw new Error('a SQLite transaction cannot start inside another');
      // The sync level can change only outside a transaction; the one set here holds for the COMMIT.
      this.connection.level(aside ? 'UNSYNCED' : 'SYNCED');
      this.connection.control('BEGIN IMMEDIATE');
      try {
        const result = await work(new SqliteSql(this.connection, this.build, 'direct', undefined));
        this.connection.control('COMMIT');
        return result;
      } catch (err) {
        if (db.inTransaction) this.connection.control('ROLLBACK');
        throw err;
      }
    };
    if (this.mode === 'direct') return transaction();
    const result = await this.connection.exclusive(this.afterReady(transaction));
    // As runSyncedAside: the turn is over, the commit's frames are in the log.
    if (aside) await this.connection.syncLog();
    return result;
  }

  async syncCommitted(): Promise<void> {
    // Out of WAL mode every commit was synced before it was shown.
    if (this.connection.inWalMode) await this.connection.syncLog();
  }

  async lock(): Promise<void> {
    return;
  }

  now(as?: 'text') {
    return written(sql.val(as === 'text' ? new Date().toISOString() : Date.now()));
  }

  clock(offsetMs = 0) {
    return written(sql.val(Date.now() + offsetMs));
  }

  time(date: Date): number {
    return date.getTime();
  }

  ago(msAgo: number) {
    return sql.val(Date.now() - msAgo);
  }

  jsonAppend(column: string, json: string) {
    return sql<string>`json_insert(${sql.ref(column)}, '$[#]', json(${json}))`;
  }

  async hasColumn(table: keyof Schema, column: string): Promise<boolean> {
    const name = SQLITE_TABLE_NAMES[table] ?? table;
    const found = await this.first(
      sql`SELECT 1 AS yes FROM pragma_table_info(${name}) WHERE name = ${column}`,
    );
    return found !== undefined;
  }

  async close(): Promise<void> {
    if (this.mode === 'direct' || this.closed) return;
    this.closed = true;
    await this.connection.release();
  }

  /** A queued handle on a file with a write-ahead log can sync a commit after its turn; a direct one commits in it. */
  private get syncsAside(): boolean {
    return this.mode === 'queued' && this.connection.inWalMode;
  }

  private afterReady<T>(work: () => T | Promise<T>): () => Promise<T> {
    return async () => {
      await this.ready;
      return work();
    };
  }

  private exec(
    query: Query<unknown>,
    { synced = true }: { synced?: boolean } = {},
  ): Promise<{ rows: unknown[]; changes: number }> {
    const statement = compiled(query, this.build);
    const run = () => (synced ? this.connection.exec(statement) : this.connection.execUnsynced(statement));
    return this.mode === 'direct' ? Promise.resolve(run()) : this.connection.exclusive(this.afterReady(run));
  }
}
