import { z } from 'zod';
import type { Pool } from '../lib/postgres';
import {
  currentPublicationOf,
  decidePublication,
  deliveryRows,
  keyRevisionOf,
  LatestRowSchema,
  RevisionRowSchema,
} from './publication-store';
import type { CurrentPublication, DeliveryRow, PublicationStore } from './publication-store';
import type { Publication, Receipt } from './types';

/** The publication database in PostgreSQL: the same rows and decisions as the SQLite one, for a fleet. */
export class PostgresPublicationStore implements PublicationStore {
  readonly where = 'the PostgreSQL publications table';

  constructor(private readonly pool: Pool) {}

  async publish(publication: Publication, idempotencyKey: string): Promise<Receipt> {
    return this.pool.transaction(async (db) => {
      // One document's deliveries take turns: the lock is held until commit, so a race on a key or on the next
      // revision number resolves as it would one after the other.
      await db.query('SELECT pg_advisory_xact_lock(hashtext($1))', [publication.documentId]);
      const seen = await db.query(
        'SELECT document_id, revision FROM publication_revisions WHERE idempotency_key = $1',
        [idempotencyKey],
      );
      const latest = await db.query(
        'SELECT revision, scheduled_at FROM publications WHERE document_id = $1',
        [publication.documentId],
      );
      const decision = decidePublication(
        publication,
        seen.rows[0] === undefined ? undefined : RevisionRowSchema.parse(seen.rows[0]),
        latest.rows[0] === undefined ? undefined : LatestRowSchema.parse(latest.rows[0]),
      );
      const { receipt } = decision;
      if (decision.outcome === 'created') {
        await db.query(
          `INSERT INTO publication_revisions (document_id, revision, idempotency_key, payload, published_at)
           VALUES ($1, $2, $3, $4, now())`,
          [publication.documentId, receipt.revision, idempotencyKey, JSON.stringify(publication)],
        );
        await db.query(
          `INSERT INTO publications (document_id, revision, title, summary, tags, updated_at, scheduled_at)
           VALUES ($1, $2, $3, $4, $5, now(), $6)
           ON CONFLICT (document_id) DO UPDATE SET revision = excluded.revision, title = excluded.title,
             summary = excluded.summary, tags = excluded.tags, updated_at = excluded.updated_at,
             scheduled_at = coalesce(excluded.scheduled_at, publications.scheduled_at)`,
          [
            publication.documentId,
            receipt.revision,
            publication.title,
            publication.summary,
            JSON.stringify(publication.tags),
            publication.scheduledAt ?? null,
          ],
        );
      }
      await db.query(
        `INSERT INTO publication_deliveries (idempotency_key, document_id, outcome, received_at)
         VALUES ($1, $2, $3, now())`,
        [idempotencyKey, receipt.documentId, decision.outcome],
      );
      return receipt;
    });
  }

  async countPublications(): Promise<number> {
    const result = await this.pool.query('SELECT count(*)::int AS n FROM publications');
    return z.object({ n: z.number() }).parse(result.rows[0]).n;
  }

  async currentPublication(documentId: string): Promise<CurrentPublication | undefined> {
    const result = await this.pool.query(
      'SELECT document_id, revision, title, summary, tags, scheduled_at FROM publications WHERE document_id = $1',
      [documentId],
    );
    if (result.rows[0] === undefined) return undefined;
    return currentPublicationOf(result.rows[0]);
  }

  async revisionsOf(documentId: string): Promise<{ revision: number; idempotencyKey: string }[]> {
    const result = await this.pool.query(
      'SELECT revision, idempotency_key FROM publication_revisions WHERE document_id = $1 ORDER BY revision',
      [documentId],
    );
    return z
      .array(z.object({ revision: z.number(), idempotency_key: z.string() }))
      .parse(result.rows)
      .map((r) => ({ revision: r.revision, idempotencyKey: r.idempotency_key }));
  }

  async revisionOfKey(idempotencyKey: string): Promise<{ documentId: string; revision: number } | undefined> {
    const result = await this.pool.query(
      'SELECT document_id, revision FROM publication_revisions WHERE idempotency_key = $1',
      [idempotencyKey],
    );
    return keyRevisionOf(result.rows[0]);
  }

  async deliveries(): Promise<DeliveryRow[]> {
    const result = await this.pool.query(
      'SELECT idempotency_key, document_id, outcome, received_at FROM publication_deliveries ORDER BY id',
    );
    return deliveryRows(result.rows);
  }

  async close(): Promise<void> {
    // The pool belongs to whoever opened it (the composition root or the receiver's command).
    return;
  }
}
