import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { logger } from '../telemetry/log';

// bigint columns (epoch milliseconds) come back as numbers: they stay far below 2^53.
pg.types.setTypeParser(pg.types.builtins.INT8, (value) => Number(value));

/** How long a store call keeps trying through an outage (a failover, a restart, a blip) before it fails. */
const DEFAULT_RETRY_FOR_MS = 60_000;
/** A connection that cannot be made, a statement that runs, or an answer that does not come, this long, fails. */
const CONNECT_TIMEOUT_MS = 5_000;
const STATEMENT_TIMEOUT_MS = 30_000;
/**
 * A session left idle inside a transaction this long is ended by the server, its locks released: a worker whose
 * connection went silent after it locked a row (a partition, a frozen host) would otherwise hold it until TCP
 * keepalive gives up (two hours by default), every other worker's call on that row failing meanwhile. No
 * transaction of the stores waits on anything but the database between its statements.
 */
const IDLE_IN_TRANSACTION_TIMEOUT_MS = 5_000;
/**
 * A statement waiting this long for a lock fails, as an outage (55P03), and is tried again on a fresh connection,
 * so waiting for a silent holder is bounded by the timeout above, not by STATEMENT_TIMEOUT_MS and the retry window.
 */
const LOCK_TIMEOUT_MS = 3_000;

/**
 * PostgreSQL for the stores of one process: a pool on DATABASE_URL whose calls survive the database failing. Every
 * client has an error listener for its whole life, checked out or idle (pg-pool listens only while a client is
 * idle, so a backend that died mid-transaction used to end the process); a client that failed is destroyed, never
 * reused; connections, statements and answers have timeouts, so a partition without a reset cannot block a call
 * for minutes. A call that met an outage (a refused or broken connection, a server shutting down or starting, a
 * serialization failure) is tried again on a fresh connection, with backoff, for up to `retryForMs`. One line is
 * logged when an outage starts and one when it ends.
 *
 * A retry must not repeat what committed. A connection that broke after a statement or a COMMIT was sent says
 * nothing about whether it committed: the server may have committed and lost only the answer. So `query` takes
 * only statements that are safe to repeat (a read, or a write whose repeat changes nothing and answers the same),
 * and a transaction leaves a marker in COMMIT_MARKERS, its id and its result, in the same commit: its retry first
 * looks for that marker and, when it is there, answers with the result it holds instead of running the work again
 * (see checkedTransaction). A transaction whose every statement is safe to repeat says so and skips the marker.
 */
export class Database {
  readonly pool: pg.Pool;
  private outageSince: number | undefined;
  private markersExist = false;
  private nextSweep = 0;

  constructor(
    url: string,
    private readonly retryForMs = DEFAULT_RETRY_FOR_MS,
  ) {
    this.pool = new pg.Pool({
      connectionString: url,
      max: 8,
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
      idleTimeoutMillis: 10_000,
      keepAlive: true,
      statement_timeout: STATEMENT_TIMEOUT_MS,
      lock_timeout: LOCK_TIMEOUT_MS,
      idle_in_transaction_session_timeout: IDLE_IN_TRANSACTION_TIMEOUT_MS,
      query_timeout: STATEMENT_TIMEOUT_MS + 5_000,
    });
    // An idle client that loses its server emits 'error' on the pool; a checked-out one on itself, below.
    this.pool.on('error', () => undefined);
    this.pool.on('connect', (client) => client.on('error', () => undefined));
  }

  /**
   * One statement, retried through an outage: only one that is safe to repeat (a read, or a write that a repeat
   * leaves as it was and answers as it did). Any other write goes through `transaction`, alone.
   */
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(
    text: string,
    values?: unknown[],
  ): Promise<pg.QueryResult<R>> {
    return this.retrying(() => this.pool.query<R>(text, values));
  }

  /**
   * `work` in one transaction on one client, the whole transaction retried through an outage, committed once: a
   * retry after a COMMIT whose answer was lost finds the marker that commit left and returns its result (which must
   * survive JSON: dates and bytes do). With `safeToRepeat`, the caller says running the work again after it
   * committed changes nothing and returns the same (the migrations: each looks again under a lock), and no marker
   * is written.
   */
  transaction<T>(
    work: (client: pg.PoolClient) => Promise<T>,
    { safeToRepeat = false }: { safeToRepeat?: boolean } = {},
  ): Promise<T> {
    if (safeToRepeat) return this.retrying(() => this.attempt(work));
    return this.checkedTransaction(work);
  }

  end(): Promise<void> {
    return this.pool.end();
  }

  /** One try of a transaction: BEGIN, `work`, COMMIT, or a rollback when the connection still stands. */
  private async attempt<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    let failure: Error | undefined;
    try {
      await client.query('BEGIN');
      const result = await work(client);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      failure = err instanceof Error ? err : new Error(String(err));
      if (!isOutage(err)) await client.query('ROLLBACK').catch(() => undefined);
      throw err;
    } finally {
      // A client whose connection failed is destroyed; one that only saw a failed statement is fine to reuse.
      client.release(failure !== undefined && isOutage(failure) ? failure : undefined);
    }
  }

  /**
   * A transaction under an id of its own that writes its marker (id and result) just before its COMMIT. Every
   * retry first inserts that id: the insert waits for an earlier try still holding the id (one whose COMMIT is on
   * its way), and finds it when that try committed, so the retry answers with the stored result and runs nothing.
   * A database whose migrations have not made the markers' table yet (while it is being migrated) gets plain
   * retries.
   */
  private checkedTransaction<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const id = randomUUID();
    let tries = 0;
    return this.retrying(async () => {
      const retry = tries++ > 0;
      if (!(await this.hasMarkers())) return this.attempt(work);
      this.sweepMarkers();
      return this.attempt(async (client) => {
        if (retry) {
          const claimed = await client.query(
            `INSERT INTO ${COMMIT_MARKERS} (id) VALUES ($1) ON CONFLICT (id) DO NOTHING`,
            [id],
          );
          if (claimed.rowCount === 0) {
            const stored = await client.query<{ result: string }>(
              `SELECT result FROM ${COMMIT_MARKERS} WHERE id = $1`,
              [id],
            );
            return decodeResult<T>(stored.rows[0]?.result);
          }
        }
        const result = await work(client);
        await client.query(
          `INSERT INTO ${COMMIT_MARKERS} (id, result) VALUES ($1, $2)
           ON CONFLICT (id) DO UPDATE SET result = excluded.result`,
          [id, encodeResult(result)],
        );
        return result;
      });
    });
  }

  /** Whether the markers' table exists; known for good once it does (no migration drops it). */
  private async hasMarkers(): Promise<boolean> {
    if (this.markersExist) return true;
    const found = await this.pool.query<{ table: string | null }>('SELECT to_regclass($1)::text AS table', [
      COMMIT_MARKERS,
    ]);
    this.markersExist = found.rows[0]?.table !== null && found.rows[0]?.table !== undefined;
    return this.markersExist;
  }

  /**
   * Deletes markers no retry can still ask for (a retry gives up after `retryForMs`), at most once every few
   * minutes per process, aside from the caller: the delete is safe to repeat, and a failed one is tried next time.
   */
  private sweepMarkers(): void {
    const now = Date.now();
    if (now < this.nextSweep) return;
    this.nextSweep = now + MARKER_SWEEP_EVERY_MS;
    const keptMs = Math.max(MARKER_KEPT_MS, 2 * this.retryForMs);
    this.pool
      .query(`DELETE FROM ${COMMIT_MARKERS} WHERE created_at < now() - $1 * interval '1 millisecond'`, [
        keptMs,
      ])
      .catch(() => {
        this.nextSweep = 0;
      });
  }

  private async retrying<T>(call: () => Promise<T>): Promise<T> {
    const deadline = Date.now() + this.retryForMs;
    for (let wait = 100; ; wait = Math.min(wait * 2, 2_000)) {
      try {
        const result = await call();
        this.recovered();
        return result;
      } catch (err) {
        if (!isOutage(err) || Date.now() + wait > deadline) throw err;
        this.outage(err);
        await sleep(wait * (0.5 + Math.random()));
      }
    }
  }

  private outage(err: unknown): void {
    if (this.outageSince !== undefined) return;
    this.outageSince = Date.now();
    logger().warn(
      { error: describe(err) },
      `PostgreSQL at DATABASE_URL failed (${describe(err)}); store calls are retried on fresh connections for up ` +
        `to ${Math.round(this.retryForMs / 1000)} s each`,
    );
  }

  private recovered(): void {
    if (this.outageSince === undefined) return;
    const seconds = ((Date.now() - this.outageSince) / 1000).toFixed(1);
    this.outageSince = undefined;
    logger().info(`PostgreSQL at DATABASE_URL answers again, after ${seconds} s`);
  }
}

/** SQLSTATE classes and codes that mean "the database or the way to it failed", not "this statement is wrong". */
const OUTAGE_CODES = new Set(['57P01', '57P02', '57P03', '53300', '40001', '40P01', '57014', '55P03']);
const OUTAGE_MESSAGES =
  /Connection terminated|connection timeout|timeout exceeded when trying to connect|Query read timeout|Client has encountered a connection error|not queryable|the database system is (starting up|shutting down)/i;

/** True for an error worth retrying on a fresh connection: the database is down, restarting or out of reach. */
export function isOutage(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = 'code' in err && typeof err.code === 'string' ? err.code : undefined;
  if (code !== undefined) {
    if (OUTAGE_CODES.has(code) || code.startsWith('08')) return true;
    if (/^E[A-Z]+$/.test(code))
      return [
        'ECONNREFUSED',
        'ECONNRESET',
        'EPIPE',
        'ETIMEDOUT',
        'EHOSTUNREACH',
        'ENETUNREACH',
        'EAI_AGAIN',
      ].includes(code);
  }
  return OUTAGE_MESSAGES.test(err.message);
}

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * The table where a transaction leaves its marker: its id, its result as JSON and when it committed (made by the
 * migration "markers of committed transactions").
 */
export const COMMIT_MARKERS = 'store_commits';
/** A marker is kept an hour (or twice the retry window, if longer): far past the last retry that may ask for it. */
const MARKER_KEPT_MS = 60 * 60_000;
const MARKER_SWEEP_EVERY_MS = 5 * 60_000;

/**
 * A transaction's result as the marker keeps it: JSON, with dates and bytes tagged so they come back as they were
 * (JSON.stringify has already turned them into strings and objects when a replacer sees them, so it looks at the
 * holder's own value).
 */
function encodeResult(result: unknown): string {
  return JSON.stringify(
    { value: result },
    function (this: Record<string, unknown>, key: string, value: unknown) {
      const own = this[key];
      if (own instanceof Date) return { [DATE_TAG]: own.toISOString() };
      if (Buffer.isBuffer(own)) return { [BYTES_TAG]: own.toString('base64') };
      return value;
    },
  );
}

function decodeResult<T>(text: string | undefined): T {
  if (text === undefined) throw new Error('a committed transaction left no result in its marker');
  const decoded: unknown = JSON.parse(text, (_key: string, value: unknown) => {
    if (value === null || typeof value !== 'object') return value;
    if (DATE_TAG in value && typeof value[DATE_TAG] === 'string') return new Date(value[DATE_TAG]);
    if (BYTES_TAG in value && typeof value[BYTES_TAG] === 'string')
      return Buffer.from(value[BYTES_TAG], 'base64');
    return value;
  });
  // What was stored is what `work` returned, of the caller's type T, through the round trip above.
  return (decoded as { value: T }).value;
}
const DATE_TAG = '$date';
const BYTES_TAG = '$bytes';

/** The stores' handle on PostgreSQL. */
export type Pool = Database;
