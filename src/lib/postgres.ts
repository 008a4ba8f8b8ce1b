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
 * PostgreSQL for the stores of one process: a pool on DATABASE_URL whose calls survive the database failing. Every
 * client has an error listener for its whole life, checked out or idle (pg-pool listens only while a client is
 * idle, so a backend that died mid-transaction used to end the process); a client that failed is destroyed, never
 * reused; connections, statements and answers have timeouts, so a partition without a reset cannot block a call
 * for minutes. A call that met an outage (a refused or broken connection, a server shutting down or starting, a
 * serialization failure) is tried again on a fresh connection, with backoff, for up to `retryForMs`. The statements
 * the stores send are safe to repeat: each is keyed, and a transaction that failed was rolled back (one whose
 * COMMIT went unanswered is repeated too, and finds its own work done). One line is logged when an outage starts
 * and one when it ends.
 */
export class Database {
  readonly pool: pg.Pool;
  private outageSince: number | undefined;

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
      query_timeout: STATEMENT_TIMEOUT_MS + 5_000,
    });
    // An idle client that loses its server emits 'error' on the pool; a checked-out one on itself, below.
    this.pool.on('error', () => undefined);
    this.pool.on('connect', (client) => client.on('error', () => undefined));
  }

  /** One statement, retried through an outage. */
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(
    text: string,
    values?: unknown[],
  ): Promise<pg.QueryResult<R>> {
    return this.retrying(() => this.pool.query<R>(text, values));
  }

  /** `work` in one transaction on one client, the whole transaction retried through an outage. */
  transaction<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    return this.retrying(async () => {
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
    });
  }

  end(): Promise<void> {
    return this.pool.end();
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

/** The stores' handle on PostgreSQL. */
export type Pool = Database;
