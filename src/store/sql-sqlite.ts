import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
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
 * SQLite's own wait for another process's lock: it blocks this thread, so it is kept short, and a longer wait is
 * spent asleep between tries (see patiently).
 */
const BUSY_TIMEOUT_MS = 50;
/** How long a statement, a transaction's BEGIN or the opening of a file waits out another process's lock. */
const BUSY_FOR_MS = 30_000;

/**
 * Opens the SQLite file of one store (the durability settings of lib/sqlite.ts) and brings its schema up to date:
 * the migrations' steps for `store`'s tables, recorded in the file's own `schema_migrations`. The handle is ready
 * at once and starts opening; its first statement waits for that, and fails with its error if it failed. A failed
 * open is not kept: the next statement opens the file again (another process held its lock, and may be done). A
 * lock held by another process is waited out for `busyForMs` without blocking the event loop.
 */
export function openSqlite(
  file: string,
  store: StoreName,
  migrations: readonly Migration[] = MIGRATIONS,
  busyForMs = BUSY_FOR_MS,
): Sql {
  const connection = Connection.of(file, busyForMs);
  const build = store === 'publications' ? renamingBuilder : plainBuilder;
  const opening = new Opening(async () => {
    try {
      await connection.open();
      await migrate(new SqliteSql(connection, build, 'direct', undefined), migrations, [store]);
    } catch (err) {
      throw new Error(
        `the SQLite file ${file} could not be brought up to date: ${err instanceof Error ? err.message : String(err)}`,
        { cause: err },
      );
    }
  });
  // Started now, in the first turn; a failure is the first statement's to report (it tries again, then).
  connection.exclusive(() => opening.ready()).catch(() => undefined);
  return new SqliteSql(connection, build, 'queued', opening);
}

/** A handle's open and migrations: done once they succeed; a failed try is tried again by the next caller. */
class Opening {
  private done = false;

  constructor(private readonly attempt: () => Promise<void>) {}

  /** Resolves once the file is open and up to date. Called in a turn of the connection, so never twice at once. */
  async ready(): Promise<void> {
    if (this.done) return;
    await this.attempt();
    this.done = true;
  }
}

/**
 * Runs `attempt` (a statement, a BEGIN IMMEDIATE, an open: none does anything when it meets a lock) until no other
 * process's lock stands in its way, asleep between tries, for up to `busyForMs`; then fails with an error that names
 * the file and, where the system says, the processes holding it.
 */
async function patiently<T>(file: string, busyForMs: number, attempt: () => T): Promise<T> {
  const deadline = Date.now() + busyForMs;
  for (let wait = 10; ; wait = Math.min(wait * 2, 250)) {
    try {
      return attempt();
    } catch (err) {
      if (!isBusy(err)) throw err;
      if (Date.now() + wait > deadline) {
        const holders = lockHolders(file);
        throw new Error(
          `the SQLite file ${file} stayed locked by another process for ${Math.round(busyForMs / 1000)} s ` +
            `(${holders.length > 0 ? `held by ${holders.join(', ')}` : 'no holder found in /proc/locks'}); ` +
            'the next call tries again: stop or wait for the process that holds it',
          { cause: err },
        );
      }
      await sleep(wait);
    }
  }
}

/** SQLITE_BUSY and SQLITE_LOCKED, with their extended codes: another connection's lock, not a fault of the SQL. */
function isBusy(err: unknown): boolean {
  const code = err instanceof Error && 'code' in err && typeof err.code === 'string' ? err.code : '';
  return code.startsWith('SQLITE_BUSY') || code.startsWith('SQLITE_LOCKED');
}

/**
 * The other processes that hold a write lock on `file`, its write-ahead log or its shared-memory index (where a
 * WAL file's write lock is), as `pid 123 (command)`, from Linux's /proc/locks; none elsewhere.
 */
function lockHolders(file: string): string[] {
  try {
    const inodes = new Set<string>();
    for (const suffix of ['', '-wal', '-shm']) {
      try {
        inodes.add(String(fs.statSync(`${file}${suffix}`).ino));
      } catch {
        // That part of the file does not exist: nothing to lock there.
      }
    }
    const pids = new Set<number>();
    for (const line of fs.readFileSync('/proc/locks', 'utf8').split('\n')) {
      const fields = line.trim().split(/\s+/);
      const [pid, device] = [Number(fields[4]), fields[5] ?? ''];
      if (fields[3] === 'WRITE' && pid > 0 && pid !== process.pid && inodes.has(device.split(':')[2] ?? ''))
        pids.add(pid);
    }
    return [...pids].map((pid) => `pid ${pid} (${commandOf(pid)})`);
  } catch {
    return [];
  }
}

function commandOf(pid: number): string {
  try {
    const command = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
    return command.length > 80 ? `${command.slice(0, 77)}...` : command;
  } catch {
    return 'gone';
  }
}

/**
 * The one better-sqlite3 connection of this process to a file, shared by every handle on it, its statements
 * prepared once each. The file is SQLite's to share between processes; within this one, work takes turns. Two
 * connections of one process must not share a file: a transaction here spans awaits, and a second connection's
 * BEGIN would wait for it as for another process's, where taking turns costs nothing. Opened in its first turn
 * (see open), not before: a file another process holds is waited for there, and a failed open leaves nothing.
 */
class Connection {
  private static readonly opened = new Map<string, Connection>();
  /** Undefined until the file opens (see open): a failed open leaves nothing behind to fail again. */
  private database: BetterSqlite3.Database | undefined;
  private readonly statements = new Map<string, BetterSqlite3.Statement>();
  private turn: Promise<void> = Promise.resolve();
  private handles = 0;
  private walMode: boolean | undefined;
  /** The sync level in force: lib/sqlite.ts opens the file with synchronous=FULL. */
  private syncLevel: 'SYNCED' | 'UNSYNCED' = 'SYNCED';
  private log: Promise<fs.promises.FileHandle> | undefined;

  /** The write-ahead log's path, fixed at open: the process may change its folder later. */
  private readonly walFile: string;

  private constructor(
    readonly file: string,
    /** How long a lock of another process is waited out (see patiently). */
    readonly busyForMs: number,
  ) {
    this.walFile = `${path.resolve(file)}-wal`;
  }

  /** The connection to `file`, made if this process has none (opened by open), counted as one more handle. */
  static of(file: string, busyForMs: number): Connection {
    const key = path.resolve(file);
    let connection = Connection.opened.get(key);
    if (connection === undefined) {
      connection = new Connection(file, busyForMs);
      Connection.opened.set(key, connection);
    }
    connection.handles += 1;
    return connection;
  }

  get db(): BetterSqlite3.Database {
    if (this.database === undefined) throw new Error(`the SQLite file ${this.file} is not open`);
    return this.database;
  }

  /** Opens the file unless it is open, waiting out another process's lock without blocking. In a turn. */
  async open(): Promise<void> {
    this.database ??= await patiently(this.file, this.busyForMs, () =>
      openDatabase(this.file, BUSY_TIMEOUT_MS),
    );
  }

  /** A statement that takes the file's write lock (a BEGIN IMMEDIATE, a write alone), waiting out other processes. */
  patiently<T>(attempt: () => T): Promise<T> {
    return patiently(this.file, this.busyForMs, attempt);
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
    Connection.opened.delete(path.resolve(this.file));
    const log = this.log;
    this.log = undefined;
    await log?.then((handle) => handle.close()).catch(() => undefined);
    this.database?.close();
    this.database = undefined;
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
    /** A queued handle's open and migrations: each of its turns first makes sure they are done. */
    private readonly opening: Opening | undefined,
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
    return (await this.exec(query, { synced: 'unsynced' })).changes;
  }

  async runSyncedAside(query: Query<unknown>): Promise<number> {
    const { changes, aside } = await this.exec(query, { synced: 'aside' });
    // After its turn: the next statement need not wait for the disk, and this one's frames are in the log already.
    if (aside) await this.connection.syncLog();
    return changes;
  }

  async transaction<T>(work: (tx: Sql) => Promise<T>, { syncAside = false } = {}): Promise<T> {
    // Known once the file is open, in the turn.
    let aside = false;
    const transaction = async (): Promise<T> => {
      const { db } = this.connection;
      aside = syncAside && this.syncsAside;
      if (db.inTransaction) throw new Error('a SQLite transaction cannot start inside another');
      // The sync level can change only outside a transaction; the one set here holds for the COMMIT.
      this.connection.level(aside ? 'UNSYNCED' : 'SYNCED');
      await this.connection.patiently(() => this.connection.control('BEGIN IMMEDIATE'));
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
    if (await this.inTurn(() => this.connection.inWalMode)) await this.connection.syncLog();
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
      await this.opening?.ready();
      return work();
    };
  }

  /** `work` in this handle's turn (a direct handle has it already), once the file is open. */
  private async inTurn<T>(work: () => T | Promise<T>): Promise<T> {
    return this.mode === 'direct' ? work() : this.connection.exclusive(this.afterReady(work));
  }

  /**
   * Runs a statement: synced, unsynced, or (`aside`) unsynced where the caller then syncs the log after the turn,
   * which it is told to do. A queued handle's statement commits alone and waits out another process's lock; a
   * direct one is in a transaction that holds the lock already.
   */
  private exec(
    query: Query<unknown>,
    { synced = 'synced' }: { synced?: 'synced' | 'unsynced' | 'aside' } = {},
  ): Promise<{ rows: unknown[]; changes: number; aside: boolean }> {
    const statement = compiled(query, this.build);
    const run = () => {
      const aside = synced === 'aside' && this.syncsAside;
      const result =
        synced === 'synced' || (synced === 'aside' && !aside)
          ? this.connection.exec(statement)
          : this.connection.execUnsynced(statement);
      return { ...result, aside };
    };
    return this.inTurn(() => (this.mode === 'direct' ? run() : this.connection.patiently(run)));
  }
}
