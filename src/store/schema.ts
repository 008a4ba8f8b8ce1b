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

/** A provider batch's claim (bulk mode, src/bulk/claims.ts): made before the batch is created, then its ID. */
export interface BulkClaimsTable {
  claim_key: string;
  /** The batch workflow's ID. */
  batch_id: string;
  round: number;
  provider: string;
  /** The requests the claim covers (BulkRequestRecord[]), as JSON. */
  requests: Json;
  provider_batch_id: string | null;
  /** What collecting its results came to (BulkCollected), once they are in the memo. */
  collected: ColumnType<unknown, string | null | undefined, string | null>;
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
  /** The publication's scheduledAt: the order of the runs of a document; null for rows from before it. */
  scheduled_at: ColumnType<number | null, number | null | undefined, number | null>;
  last_error: string | null;
  created_at: Time;
  updated_at: Time;
}

export interface PublicationsTable {
  document_id: string;
  revision: number;
  title: string;
  /** The steps' fields of the publication, one JSON object (migration 8; before it, summary and tags). */
  fields: Json;
  /** Written only before migration 8, which copied them into `fields`; null in rows written since. */
  summary: ColumnType<string | null, never, never>;
  tags: ColumnType<unknown, never, never>;
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

/** One scope's pacing state (a provider's model behind one address): see src/model/rate-limit.ts. */
export interface ModelLimitsTable {
  scope: string;
  state: Json;
  updated_at: Time;
}

/**
 * A call's place in its scope's queue, kept until the call ends: the calls in flight, and the tokens and dollars a
 * budget has promised but not yet seen spent. Times are epoch milliseconds of the store's clock in both backends.
 */
export interface ModelCallHoldsTable {
  hold_key: string;
  /** Tells one hold under a key from the next one under the same key (a retry after a refusal). */
  nonce: string;
  scope: string;
  budget_id: string | null;
  tokens: number;
  /** The most the call may cost, as its budget holds it (tokens is the pacing's likelier figure); null: tokens. */
  budget_tokens: number | null;
  usd: number;
  start_at: number;
  lease_until: number;
  /** When the call was let go to the provider (store clock); null while it waits for its turn. */
  sent_at: number | null;
  /** Set when the call ended and its spending was counted: a repeated end counts nothing. */
  ended: Flag;
}

/** A budget of tokens and dollars that a batch or a run may spend on model calls; null: no limit on that measure. */
export interface ModelBudgetsTable {
  budget_id: string;
  limit_tokens: number | null;
  limit_usd: number | null;
  spent_tokens: ColumnType<number, number | undefined, number>;
  spent_usd: ColumnType<number, number | undefined, number>;
  created_at: Time;
  updated_at: Time;
}

/** Runs paused because a call would pass their budget: raising it wakes them. */
export interface ModelBudgetWaitersTable {
  budget_id: string;
  workflow_id: string;
  since: Time;
}

/**
 * PostgreSQL only: the marker a transaction commits with, so its retry after a lost answer to COMMIT finds it done
 * (see lib/postgres.ts). `result` is null only inside a retry that has not finished.
 */
export interface StoreCommitsTable {
  id: string;
  result: string | null;
  created_at: Time;
}

export interface SchemaMigrationsTable {
  version: number;
  name: string;
  applied_at: Time;
}

/**
 * An agent step's checkpoints (src/steps/agent-store.ts): each turn's conversation as it was sent, and each tool
 * call's output, under `<runId>:<step>:turn-<n>` or `:call-<n>`. Written once; a retry writes the same body.
 */
export interface AgentCheckpointsTable {
  checkpoint_key: string;
  workflow_id: string;
  step: string;
  body: Json;
  chars: number;
  created_at: Time;
}

/** Every table, by its PostgreSQL name (see SQLITE_TABLE_NAMES for the two a SQLite file names otherwise). */
export interface Schema {
  blobs: BlobsTable;
  model_memo: ModelMemoTable;
  bulk_claims: BulkClaimsTable;
  agent_checkpoints: AgentCheckpointsTable;
  delivery_ledger: DeliveryLedgerTable;
  publications: PublicationsTable;
  publication_revisions: PublicationRevisionsTable;
  publication_deliveries: PublicationDeliveriesTable;
  model_limits: ModelLimitsTable;
  model_call_holds: ModelCallHoldsTable;
  model_budgets: ModelBudgetsTable;
  model_budget_waiters: ModelBudgetWaitersTable;
  store_commits: StoreCommitsTable;
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
