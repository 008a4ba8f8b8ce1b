/**
 * The stores' tables as the code sees them, once for both backends. A value reads back in the backend's own
 * type: a time is a `Date` from PostgreSQL (timestamptz) and epoch milliseconds or ISO text from SQLite, a JSON
 * column is parsed from PostgreSQL (jsonb) and text from SQLite, a flag is a boolean or 0/1. The helpers in
 * sql.ts read them into one shape. The tables themselves are made by the numbered steps in migrations.ts.
 */
import type { ColumnType, Generated } from 'kysely';

declare const written: unique symbol;
/**
 * What a time column is written with: only an expression of the backend's clock (Sql.now, Sql.clock), never a
 * value the code computed, since PostgreSQL reads the database's clock and SQLite keeps its own encoding.
 */
export interface WrittenTime {
  readonly [written]: true;
}
type Time = ColumnType<Date | number | string, WrittenTime, WrittenTime>;
/** JSON: written as JSON text. */
type Json = ColumnType<unknown, string, string>;
type Flag = ColumnType<boolean | number | null, boolean | undefined, boolean>;

export interface BlobsTable {
  ref: string;
  bytes: Buffer;
  created_at: Time;
}

export interface ModelMemoTable {
  memo_key: string;
  workflow_id: string;
  step: string;
  request_hash: string;
  run_id: string;
  owner: string | null;
  lease_until: ColumnType<Date | number | null, WrittenTime | null, WrittenTime | null>;
  answer: ColumnType<unknown, string | null, string | null>;
  provider_failures: ColumnType<number, number | undefined, number>;
  rejected: ColumnType<unknown, string | undefined, string>;
  created_at: Time;
  updated_at: Time;
}

export interface DeliveryLedgerTable {
  idempotency_key: string;
  workflow_id: string;
  document_id: string;
  state: 'claimed' | 'delivered' | 'unsent';
  owner: string | null;
  attempts: ColumnType<number, number | undefined, number>;
  receipt: ColumnType<unknown, string | undefined, string>;
  receiver_echoed_key: Flag;
  echoed_by: string | null;
  text_ref: string | null;
  last_error: string | null;
  created_at: Time;
  updated_at: Time;
}

export interface PublicationsTable {
  document_id: string;
  revision: number;
  title: string;
  summary: string;
  tags: Json;
  updated_at: Time;
  scheduled_at: number | null;
}

export interface PublicationRevisionsTable {
  document_id: string;
  revision: number;
  idempotency_key: string;
  payload: Json;
  published_at: Time;
}

export interface PublicationDeliveriesTable {
  id: Generated<number>;
  idempotency_key: string;
  document_id: string;
  outcome: 'created' | 'duplicate' | 'stale';
  received_at: Time;
}

export interface SchemaMigrationsTable {
  version: number;
  name: string;
  applied_at: Time;
}

/** Every table, by its PostgreSQL name (see SQLITE_TABLE_NAMES for the two a SQLite file names otherwise). */
export interface Schema {
  blobs: BlobsTable;
  model_memo: ModelMemoTable;
  delivery_ledger: DeliveryLedgerTable;
  publications: PublicationsTable;
  publication_revisions: PublicationRevisionsTable;
  publication_deliveries: PublicationDeliveriesTable;
  schema_migrations: SchemaMigrationsTable;
}

/**
 * The publication file of SQLite had its tables before PostgreSQL did, under shorter names; a file keeps them.
 * The code names a table once, and a SQLite handle writes these names in its place.
 */
export const SQLITE_TABLE_NAMES: Readonly<Partial<Record<keyof Schema, string>>> = {
  publication_revisions: 'revisions',
  publication_deliveries: 'deliveries',
};

/** Which store's file a table lives in, in SQLite (in PostgreSQL they share one database). */
export type StoreName = 'blobs' | 'memo' | 'ledger' | 'publications';
