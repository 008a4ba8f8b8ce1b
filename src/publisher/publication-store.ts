import type Database from 'better-sqlite3';
import { z } from 'zod';
import { openDatabase } from '../lib/sqlite';
import type { Publication, Receipt } from './types';

const RevisionRowSchema = z.object({ document_id: z.string(), revision: z.number() });
const LatestRowSchema = z.object({ revision: z.number(), scheduled_at: z.number().nullable() });
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
 * delivery attempt. The idempotency key is written in the same transaction as the revision it produced, so a key
 * never writes twice, and a new key for a known document (a workflow reset) becomes its next revision, unless its
 * `scheduledAt` is older than that of the publication already there: then it comes from a run a newer one replaced
 * (a zombie worker still retrying, a request that arrived late) and is answered as superseded, never written.
 */
export class PublicationStore {
  private readonly db: Database.Database;

  constructor(file: string) {
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

  /**
   * Upserts the publication under this key in one transaction; a key seen before returns its first receipt. A new
   * key whose `scheduledAt` is older than the current publication's is recorded as a `stale` delivery and answered
   * with the current revision and `superseded: true`. Without `scheduledAt` on either side, a new key always
   * becomes the next revision (publications from before the ordering existed).
   */
  publish(publication: Publication, idempotencyKey: string): Receipt {
    const now = new Date().toISOString();
    const run = this.db.transaction((): Receipt => {
      const seen = RevisionRowSchema.safeParse(
        this.db
          .prepare('SELECT document_id, revision FROM revisions WHERE idempotency_key = ?')
          .get(idempotencyKey),
      );
      if (seen.success) {
        this.recordDelivery(idempotencyKey, seen.data.document_id, 'duplicate', now);
        return { documentId: seen.data.document_id, revision: seen.data.revision, duplicate: true };
      }
      const latest = LatestRowSchema.safeParse(
        this.db
          .prepare('SELECT revision, scheduled_at FROM publications WHERE document_id = ?')
          .get(publication.documentId),
      );
      const scheduledAt = publication.scheduledAt ?? null;
      if (
        latest.success &&
        latest.data.scheduled_at !== null &&
        scheduledAt !== null &&
        scheduledAt < latest.data.scheduled_at
      ) {
        this.recordDelivery(idempotencyKey, publication.documentId, 'stale', now);
        return {
          documentId: publication.documentId,
          revision: latest.data.revision,
          duplicate: false,
          superseded: true,
        };
      }
      const revision = latest.success ? latest.data.revision + 1 : 1;
      this.db
        .prepare(
          'INSERT INTO revisions (document_id, revision, idempotency_key, payload, published_at) VALUES (?, ?, ?, ?, ?)',
        )
        .run(publication.documentId, revision, idempotencyKey, JSON.stringify(publication), now);
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
          revision,
          title: publication.title,
          summary: publication.summary,
          tags: JSON.stringify(publication.tags),
          now,
          scheduledAt,
        });
      this.recordDelivery(idempotencyKey, publication.documentId, 'created', now);
      return { documentId: publication.documentId, revision, duplicate: false };
    });
    // IMMEDIATE takes the write lock up front, so two workers racing on one key serialise instead of deadlocking.
    return run.immediate();
  }

  /** Number of documents published (one row per document ID, whatever its revision). */
  countPublications(): number {
    return CountSchema.parse(this.db.prepare('SELECT count(*) AS n FROM publications').get()).n;
  }

  /** The current (latest accepted) publication of a document, or undefined if it was never published. */
  currentPublication(documentId: string): CurrentPublication | undefined {
    const row = this.db
      .prepare(
        'SELECT document_id, revision, title, summary, tags, scheduled_at FROM publications WHERE document_id = ?',
      )
      .get(documentId);
    if (row === undefined) return undefined;
    const r = z
      .object({
        document_id: z.string(),
        revision: z.number(),
        title: z.string(),
        summary: z.string(),
        tags: z.string(),
        scheduled_at: z.number().nullable(),
      })
      .parse(row);
    return {
      documentId: r.document_id,
      revision: r.revision,
      title: r.title,
      summary: r.summary,
      tags: z.array(z.string()).parse(JSON.parse(r.tags)),
      scheduledAt: r.scheduled_at,
    };
  }

  /** All revisions of one document, oldest first. */
  revisionsOf(documentId: string): { revision: number; idempotencyKey: string }[] {
    const rows = this.db
      .prepare('SELECT revision, idempotency_key FROM revisions WHERE document_id = ? ORDER BY revision')
      .all(documentId);
    return z
      .array(z.object({ revision: z.number(), idempotency_key: z.string() }))
      .parse(rows)
      .map((r) => ({ revision: r.revision, idempotencyKey: r.idempotency_key }));
  }

  /** Every delivery attempt that reached the store, in order: the evidence that retries reused one key. */
  deliveries(): DeliveryRow[] {
    const rows = this.db
      .prepare('SELECT idempotency_key, document_id, outcome, received_at FROM deliveries ORDER BY id')
      .all();
    return z
      .array(
        z.object({
          idempotency_key: z.string(),
          document_id: z.string(),
          outcome: z.enum(OUTCOMES),
          received_at: z.string(),
        }),
      )
      .parse(rows)
      .map((r) => ({
        idempotencyKey: r.idempotency_key,
        documentId: r.document_id,
        outcome: r.outcome,
        receivedAt: r.received_at,
      }));
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

  close(): void {
    this.db.close();
  }
}
