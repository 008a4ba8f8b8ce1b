/**
 * The PostgreSQL schema, as numbered steps. A database records the versions it has (`schema_migrations`) and
 * gets only the missing ones at start. Never edit a step that has shipped: add the next number.
 */
import type { Migration } from '../lib/postgres';

export const POSTGRES_MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: 'blobs, model memo, delivery ledger, publications',
    sql: `
      CREATE TABLE blobs (
        ref text PRIMARY KEY,
        bytes bytea NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
      );

      CREATE TABLE model_memo (
        memo_key text PRIMARY KEY,
        workflow_id text NOT NULL,
        step text NOT NULL,
        request_hash text NOT NULL,
        run_id text NOT NULL,
        owner text,
        lease_until timestamptz,
        answer jsonb,
        provider_failures integer NOT NULL DEFAULT 0,
        rejected jsonb NOT NULL DEFAULT '[]',
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE INDEX model_memo_workflow_id ON model_memo (workflow_id);

      CREATE TABLE delivery_ledger (
        idempotency_key text PRIMARY KEY,
        workflow_id text NOT NULL,
        document_id text NOT NULL,
        state text NOT NULL CHECK (state IN ('claimed', 'delivered', 'unsent')),
        owner text,
        attempts integer NOT NULL DEFAULT 0,
        receipt jsonb,
        receiver_echoed_key boolean,
        last_error text,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE INDEX delivery_ledger_open ON delivery_ledger (state) WHERE state = 'claimed';

      CREATE TABLE publications (
        document_id text PRIMARY KEY,
        revision integer NOT NULL,
        title text NOT NULL,
        summary text NOT NULL,
        tags jsonb NOT NULL,
        updated_at timestamptz NOT NULL,
        scheduled_at bigint
      );
      CREATE TABLE publication_revisions (
        document_id text NOT NULL,
        revision integer NOT NULL,
        idempotency_key text NOT NULL UNIQUE,
        payload jsonb NOT NULL,
        published_at timestamptz NOT NULL,
        PRIMARY KEY (document_id, revision)
      );
      CREATE TABLE publication_deliveries (
        id bigserial PRIMARY KEY,
        idempotency_key text NOT NULL,
        document_id text NOT NULL,
        outcome text NOT NULL,
        received_at timestamptz NOT NULL
      );
    `,
  },
  {
    version: 2,
    name: 'the origin of the receiver that echoed a delivery key',
    sql: `ALTER TABLE delivery_ledger ADD COLUMN echoed_by text`,
  },
  {
    version: 3,
    name: "the version a delivery publishes, so a later run finds an earlier run's open claim on it",
    sql: `ALTER TABLE delivery_ledger ADD COLUMN text_ref text;
      CREATE INDEX delivery_ledger_open_version ON delivery_ledger (document_id, text_ref) WHERE state = 'claimed';`,
  },
];
