import type Database from 'better-sqlite3';
import { z } from 'zod';
import { openDatabase } from '../lib/sqlite';
import type { Publication, Receipt } from './types';

export const RevisionRowSchema = z.object({ document_id: z.string(), revision: z.number() });
export const LatestRowSchema = z.object({ revision: z.number(), scheduled_at: z.number().nullable() });
const CountSchema = z.object({ n: z.number() });
const OUTCOMES = ['created', 'duplicate', 'stale'] as const;

export interface DeliveryRow {
  idempotencyKey: string;
  documentId: string;
  /** `stale`: a new key from a run older than the one already published; answered, not written. */
  outcome: (typeof OUTCOMES)[number];
  receivedAt: string;
}

/** The current publication of a document, as the `publications` row holds it. */
export interface CurrentPublication {
  documentId: string;
  revision: number;
  title: string;
  summary: string;
  tags: string[];
  scheduledAt: number | null;
}

/**
 * The publish target's database: one row per document (the latest revision), one row per revision, and every
 * delivery attempt. A key never writes twice; a new key for a known document becomes its next revision unless it
 * comes from a run older than the publication already there (then it is answered as superseded, never written).
 */
export interface PublicationStore {
  /** Where it keeps its rows, for messages. */
  readonly where: string;
  /** Writes the publication under this key in one transaction, or answers with the receipt the key already has. */
  publish(publication: Publication, idempotencyKey: string): Promise<Receipt>;
  /** Number of documents published (one row per document ID, whatever its revision). */
  countPublications(): Promise<number>;
  /** The current (latest accepted) publication of a document, or undefined if it was never published. */
  currentPublication(documentId: string): Promise<CurrentPublication | undefined>;
  /** All revisions of one document, oldest first. */
  revisionsOf(documentId: string): Promise<{ revision: number; idempotencyKey: string }[]>;
  /** Every delivery attempt that reached the store, in order: the evidence that retries reused one key. */
  deliveries(): Promise<DeliveryRow[]>;
  /** The revision a key wrote, if it wrote one: what the receiver's lookup by key answers. */
  revisionOfKey(idempotencyKey: string): Promise<{ documentId: string; revision: number } | undefined>;
  close(): Promise<void>;
}

const KeyRevisionSchema = z.object({ document_id: z.string(), revision: z.number() });

/** A row of the revisions table as a lookup's answer. */
export function keyRevisionOf(row: unknown): { documentId: string; revision: number } | undefined {
  if (row === undefined) return undefined;
  const r = KeyRevisionSchema.parse(row);
  return { documentId: r.document_id, revision: r.revision };
}

/**
 * The publication database in one SQLite file: one row per document (the latest revision), one row per revision, and every
 * delivery attempt. The idempotency key is written in the same transaction as the revision it produced, so a key
 * never writes twice, and a new key for a known document (a workflow reset) becomes its next revision, unless its
 * `scheduledAt` is older than that of the publication already there: then it comes from a run a newer one replaced
 * (a zombie worker still retrying, a request that arrived late) and is answered as superseded, never written.
 */
export class SqlitePublicationStore implements PublicationStore {
  private readonly db: Database.Database;

  constructor(private readonly file: string) {
    this.db = openDatabase(file);
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS publications (
        document_id TEXT PRIMARY KEY,
        revision INTEGER NOT NULL,
        title TEXT NOT NULL,
        summary TEXT NOT NULL,
        tags TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        scheduled_at INTEGER
      );
      CREATE TABLE IF NOT EXISTS revisions (
        document_id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        idempotency_key TEXT NOT NULL UNIQUE,
        payload TEXT NOT NULL,
        published_at TEXT NOT NULL,
        PRIMARY KEY (document_id, revision)
      );
      CREATE TABLE IF NOT EXISTS deliveries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        idempotency_key TEXT NOT NULL,
        document_id TEXT NOT NULL,
        outcome TEXT NOT NULL,
        received_at TEXT NOT NULL
      );`);
    // Databases created before publications were ordered have no scheduled_at column: add it (NULL = unordered).
    // Under the write lock, so two workers opening one old database at once do not both add it.
    const addOrderColumn = this.db.transaction(() => {
      const columns = z
        .array(z.object({ name: z.string() }))
        .parse(this.db.pragma('table_info(publications)'));
      if (!columns.some((c) => c.name === 'scheduled_at')) {
        this.db.exec('ALTER TABLE publications ADD COLUMN scheduled_at INTEGER');
      }
    });
    addOrderColumn.immediate();
  }

  get where(): string {
    return this.file;
  }

  async publish(publication: Publication, idempotencyKey: string): Promise<Receipt> {
    const now = new Date().toISOString();
    const run = this.db.transaction((): Receipt => {
      const seen = RevisionRowSchema.safeParse(
        this.db
          .prepare('SELECT document_id, revision FROM revisions WHERE idempotency_key = ?')
          .get(idempotencyKey),
      );
      const latest = LatestRowSchema.safeParse(
        this.db
          .prepare('SELECT revision, scheduled_at FROM publications WHERE document_id = ?')
          .get(publication.documentId),
      );
      const decision = decidePublication(
        publication,
        seen.success ? seen.data : undefined,
        latest.success ? latest.data : undefined,
      );
      const { receipt } = decision;
      if (decision.outcome === 'created') {
        this.db
          .prepare(
            'INSERT INTO revisions (document_id, revision, idempotency_key, payload, published_at) VALUES (?, ?, ?, ?, ?)',
          )
          .run(publication.documentId, receipt.revision, idempotencyKey, JSON.stringify(publication), now);
        this.db
          .prepare(
            `INSERT INTO publications (document_id, revision, title, summary, tags, updated_at, scheduled_at)
             VALUES (@documentId, @revision, @title, @summary, @tags, @now, @scheduledAt)
             ON CONFLICT (document_id) DO UPDATE SET revision = excluded.revision, title = excluded.title,
               summary = excluded.summary, tags = excluded.tags, updated_at = excluded.updated_at,
               scheduled_at = coalesce(excluded.scheduled_at, publications.scheduled_at)`,
          )
          .run({
            documentId: publication.documentId,
            revision: receipt.revision,
            title: publication.title,
            summary: publication.summary,
            tags: JSON.stringify(publication.tags),
            now,
            scheduledAt: publication.scheduledAt ?? null,
          });
      }
      this.recordDelivery(idempotencyKey, receipt.documentId, decision.outcome, now);
      return receipt;
    });
    // IMMEDIATE takes the write lock up front, so two workers racing on one key serialise instead of deadlocking.
    return run.immediate();
  }

  /** Number of documents published (one row per document ID, whatever its revision). */
  async countPublications(): Promise<number> {
    return CountSchema.parse(this.db.prepare('SELECT count(*) AS n FROM publications').get()).n;
  }

  /** The current (latest accepted) publication of a document, or undefined if it was never published. */
  async currentPublication(documentId: string): Promise<CurrentPublication | undefined> {
    const row = this.db
      .prepare(
        'SELECT document_id, revision, title, summary, tags, scheduled_at FROM publications WHERE document_id = ?',
      )
      .get(documentId);
    if (row === undefined) return undefined;
    return currentPublicationOf(row);
  }

  /** All revisions of one document, oldest first. */
  async revisionsOf(documentId: string): Promise<{ revision: number; idempotencyKey: string }[]> {
    const rows = this.db
      .prepare('SELECT revision, idempotency_key FROM revisions WHERE document_id = ? ORDER BY revision')
      .all(documentId);
    return z
      .array(z.object({ revision: z.number(), idempotency_key: z.string() }))
      .parse(rows)
      .map((r) => ({ revision: r.revision, idempotencyKey: r.idempotency_key }));
  }

  async revisionOfKey(idempotencyKey: string): Promise<{ documentId: string; revision: number } | undefined> {
    return keyRevisionOf(
      this.db
        .prepare('SELECT document_id, revision FROM revisions WHERE idempotency_key = ?')
        .get(idempotencyKey),
    );
  }

  /** Every delivery attempt that reached the store, in order: the evidence that retries reused one key. */
  async deliveries(): Promise<DeliveryRow[]> {
    const rows = this.db
      .prepare('SELECT idempotency_key, document_id, outcome, received_at FROM deliveries ORDER BY id')
      .all();
    return deliveryRows(rows);
  }

  private recordDelivery(
    key: string,
    documentId: string,
    outcome: DeliveryRow['outcome'],
    now: string,
  ): void {
    this.db
      .prepare(
        'INSERT INTO deliveries (idempotency_key, document_id, outcome, received_at) VALUES (?, ?, ?, ?)',
      )
      .run(key, documentId, outcome, now);
  }

  async close(): Promise<void> {
    this.db.close();
    return;
  }
}

/**
 * What a delivery does, from what the store holds: a key seen before gets its first receipt back (`duplicate`); a
 * new key whose `scheduledAt` is older than the current publication's comes from a run a newer one replaced (a
 * zombie worker, a late request) and is answered with the current revision and `superseded: true` (`stale`);
 * any other new key writes the next revision (`created`). Without `scheduledAt` on either side a new key always
 * writes: publications from before the ordering existed. Both backends decide here.
 */
export function decidePublication(
  publication: Publication,
  seen: { document_id: string; revision: number } | undefined,
  latest: { revision: number; scheduled_at: number | null } | undefined,
): { outcome: DeliveryRow['outcome']; receipt: Receipt } {
  if (seen !== undefined) {
    return {
      outcome: 'duplicate',
      receipt: { documentId: seen.document_id, revision: seen.revision, duplicate: true },
    };
  }
  const scheduledAt = publication.scheduledAt ?? null;
  if (latest?.scheduled_at != null && scheduledAt !== null && scheduledAt < latest.scheduled_at) {
    return {
      outcome: 'stale',
      receipt: {
        documentId: publication.documentId,
        revision: latest.revision,
        duplicate: false,
        superseded: true,
      },
    };
  }
  return {
    outcome: 'created',
    receipt: { documentId: publication.documentId, revision: (latest?.revision ?? 0) + 1, duplicate: false },
  };
}

/** A `publications` row as a CurrentPublication; tags are JSON text in SQLite and jsonb in PostgreSQL. */
export function currentPublicationOf(row: unknown): CurrentPublication {
  const r = z
    .object({
      document_id: z.string(),
      revision: z.number(),
      title: z.string(),
      summary: z.string(),
      tags: z.union([
        z.array(z.string()),
        z.string().transform((text) => z.array(z.string()).parse(JSON.parse(text))),
      ]),
      scheduled_at: z.number().nullable(),
    })
    .parse(row);
  return {
    documentId: r.document_id,
    revision: r.revision,
    title: r.title,
    summary: r.summary,
    tags: r.tags,
    scheduledAt: r.scheduled_at,
  };
}

/** Parses delivery rows (same columns in both backends) into DeliveryRow objects. */
export function deliveryRows(rows: unknown): DeliveryRow[] {
  return z
    .array(
      z.object({
        idempotency_key: z.string(),
        document_id: z.string(),
        outcome: z.enum(OUTCOMES),
        received_at: z.union([z.string(), z.date()]),
      }),
    )
    .parse(rows)
    .map((r) => ({
      idempotencyKey: r.idempotency_key,
      documentId: r.document_id,
      outcome: r.outcome,
      receivedAt: typeof r.received_at === 'string' ? r.received_at : r.received_at.toISOString(),
    }));
}
