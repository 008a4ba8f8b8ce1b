/**
 * A real PostgreSQL for tests: the server at TEST_DATABASE_URL (by default the local one, trust auth), with fresh
 * databases (or fresh schemas, far cheaper) on it, dropped after the file's tests.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { Defer } from './scratch';

/** The test server, as a URL to its maintenance database (databases are created and dropped from there). */
export const TEST_DATABASE_URL =
  process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

/** Throws an error that says what to do unless PostgreSQL answers a query at TEST_DATABASE_URL. */
export async function assertPostgresAnswers(): Promise<void> {
  try {
    await onDatabase(TEST_DATABASE_URL, (client) => client.query('SELECT 1'));
  } catch (err) {
    const { hostname, port } = new URL(TEST_DATABASE_URL);
    throw new Error(
      `PostgreSQL does not answer on ${hostname}:${port || '5432'}: start it, or set TEST_DATABASE_URL ` +
        `(${err instanceof Error ? err.message : String(err)})`,
      { cause: err },
    );
  }
}

let answers: Promise<void> | undefined;

/**
 * Creates an empty database with a unique name on the test server and returns its URL. It is dropped after the
 * file's tests, connections still open to it included; end the pools on it first anyway (defer them later).
 */
export async function freshDatabase(defer: Defer): Promise<string> {
  answers ??= assertPostgresAnswers();
  await answers;
  // npm test's runner marks its run (scripts/test.ts): it drops what a killed file could not.
  const run = process.env.PIPELINE_TEST_RUN;
  const name = uniqueName(
    run !== undefined && /^[0-9a-f]{8}$/.test(run) ? `pipeline_test_${run}` : 'pipeline_test',
  );
  await onDatabase(TEST_DATABASE_URL, (client) => client.query(`CREATE DATABASE ${name}`));
  defer(() => onDatabase(TEST_DATABASE_URL, (client) => client.query(`DROP DATABASE ${name} WITH (FORCE)`)));
  const url = new URL(TEST_DATABASE_URL);
  url.pathname = `/${name}`;
  return url.toString();
}

const sharedDatabases = new WeakMap<Defer, Promise<string>>();

/**
 * Creates an empty schema in one fresh database that all calls with this `defer` share, and returns a URL whose
 * connections make and find their tables in it (their search_path is that schema). For code that names its tables
 * unqualified, as isolated as a database of its own, and far cheaper: dropping dozens of databases takes seconds.
 */
export async function freshSchema(defer: Defer): Promise<string> {
  let database = sharedDatabases.get(defer);
  if (database === undefined) {
    database = freshDatabase(defer);
    sharedDatabases.set(defer, database);
  }
  const url = new URL(await database);
  const name = uniqueName('schema');
  await onDatabase(url.toString(), (client) => client.query(`CREATE SCHEMA ${name}`));
  url.searchParams.set('options', `-c search_path=${name}`);
  return url.toString();
}

/** A name no other test run uses, valid unquoted in SQL. */
function uniqueName(prefix: string): string {
  return `${prefix}_${randomUUID().replaceAll('-', '')}`;
}

/** Runs `work` on one connection to the database at `url`, closed afterwards. */
export async function onDatabase(url: string, work: (client: pg.Client) => Promise<unknown>): Promise<void> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5_000 });
  try {
    await client.connect();
    await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}
