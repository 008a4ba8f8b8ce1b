import { SqlBulkClaims } from '../bulk/claims';
import { SqlAgentCheckpoints } from '../steps/agent-store';
import type { Config } from '../config';
import { FileBlobStore } from '../documents/blobs';
import type { BlobStore } from '../documents/blobs';
import { TableBlobStore } from '../documents/blobs-table';
import type { AnswerMemo } from '../model/memo';
import { SqlAnswerMemo } from '../model/memo-store';
import { SqlRateLimits } from '../model/rate-limit-store';
import type { DeliveryLedger } from '../publisher/ledger';
import { SqlDeliveryLedger, SqliteDeliveryLedger } from '../publisher/ledger-store';
import { SqlitePublicationStore, SqlPublicationStore } from '../publisher/publication-store';
import type { PublicationStore } from '../publisher/publication-store';
import { openPostgres, postgresSql } from './sql-postgres';
import { openSqlite } from './sql-sqlite';

/** The state the pipeline keeps, in one backend: the embedded SQLite files, or the fleet's PostgreSQL. */
export interface Stores {
  backend: 'sqlite' | 'postgres';
  blobs: BlobStore;
  memo: AnswerMemo;
  ledger: DeliveryLedger;
  /** The pacing of model calls and the budgets, shared by every worker on this backend (beside the memo). */
  rateLimits: SqlRateLimits;
  /** The claims of provider batches (bulk mode), beside the memo. */
  bulkClaims: SqlBulkClaims;
  /** Agent steps' checkpoints (conversations as sent, tools' outputs), beside the memo. */
  checkpoints: SqlAgentCheckpoints;
  /** The built-in publish target's database, opened on first use (a webhook deployment never opens it). */
  publications(): PublicationStore;
  close(): Promise<void>;
}

/**
 * Opens the stores the configuration names. With DATABASE_URL they share one PostgreSQL pool (the schema brought
 * up to date first); without it each is a file in DATA_DIR, which only processes on this machine can share, each
 * file's schema brought up to date as it opens.
 */
export async function openStores(config: Config): Promise<Stores> {
  if (config.database.kind === 'postgres') {
    const pool = await openPostgres(config.database.url);
    const db = postgresSql(pool);
    const publications = new SqlPublicationStore(db);
    return {
      backend: 'postgres',
      blobs: new TableBlobStore(db),
      memo: new SqlAnswerMemo(db),
      ledger: new SqlDeliveryLedger(db),
      rateLimits: new SqlRateLimits(db),
      bulkClaims: new SqlBulkClaims(db),
      checkpoints: new SqlAgentCheckpoints(db),
      publications: () => publications,
      close: () => pool.end(),
    };
  }
  const files = config.paths;
  // The pacing shares the memo's file (and its one connection of this process).
  const memoDb = openSqlite(files.memo, 'memo');
  const memo = new SqlAnswerMemo(memoDb);
  const ledger = new SqliteDeliveryLedger(files.ledger);
  let publications: SqlitePublicationStore | undefined;
  return {
    backend: 'sqlite',
    blobs: new FileBlobStore(files.blobs),
    memo,
    ledger,
    rateLimits: new SqlRateLimits(memoDb),
    bulkClaims: new SqlBulkClaims(memoDb),
    checkpoints: new SqlAgentCheckpoints(memoDb),
    publications: () => (publications ??= new SqlitePublicationStore(files.publications)),
    async close() {
      await memo.close();
      await ledger.close();
      await publications?.close();
    },
  };
}
