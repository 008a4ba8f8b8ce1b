import type Database from 'better-sqlite3';
import { z } from 'zod';
import { openDatabase } from '../sqlite';
import type { Publication, Receipt } from './types';

const RevisionRowSchema = z.object({ document_id: z.string(), revision: z.number() });
const CountSchema = z.object({ n: z.number() });

export interface DeliveryRow {
  idempotencyKey: string;
  documentId: string;
  outcome: 'created' | 'duplicate';
  receivedAt: string;
}

/**
 * The publish target's database: one row per document (the latest revision), one row per revision, and every
 * delivery attempt. The idempotency key is written in the same transaction as the revision it produced, so a key
 * never writes twice, and a new key for a known document (a workflow reset) becomes its next revision.
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
        updated_at TEXT NOT NULL
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
  }

  /** Upserts the publication under this key in one transaction; a key seen before returns its first receipt. */
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
      const latest = RevisionRowSchema.safeParse(
        this.db
          .prepare('SELECT document_id, revision FROM publications WHERE document_id = ?')
          .get(publication.documentId),
      );
      const revision = latest.success ? latest.data.revision + 1 : 1;
      this.db
        .prepare(
          'INSERT INTO revisions (document_id, revision, idempotency_key, payload, published_at) VALUES (?, ?, ?, ?, ?)',
        )
        .run(publication.documentId, revision, idempotencyKey, JSON.stringify(publication), now);
      this.db
        .prepare(
          `INSERT INTO publications (document_id, revision, title, summary, tags, updated_at)
           VALUES (@documentId, @revision, @title, @summary, @tags, @now)
           ON CONFLICT (document_id) DO UPDATE SET revision = excluded.revision, title = excluded.title,
             summary = excluded.summary, tags = excluded.tags, updated_at = excluded.updated_at`,
        )
        .run({
          documentId: publication.documentId,
          revision,
          title: publication.title,
          summary: publication.summary,
          tags: JSON.stringify(publication.tags),
          now,
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
          outcome: z.enum(['created', 'duplicate']),
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
