import { sql } from 'kysely';
import { z } from 'zod';
import { dateOf, jsonOf } from '../store/sql';
import type { Sql } from '../store/sql';
import { openSqlite } from '../store/sql-sqlite';
import { stepFieldsOf } from './types';
import { canonicalJson } from '../lib/canonical-json';
import type { Publication, Receipt } from './types';

export interface DeliveryRow {
  idempotencyKey: string;
  documentId: string;
  /** `stale`: a new key from a run older than the one already published; answered, not written. */
  outcome: 'created' | 'duplicate' | 'stale';
  receivedAt: string;
}

/** The current publication of a document, as the `publications` row holds it. */
export interface CurrentPublication {
  documentId: string;
  revision: number;
  title: string;
  scheduledAt: number | null;
  /** The steps' fields of the publication (stepFieldsOf), as it carried them: the store knows none by name. */
  fields: Record<string, unknown>;
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
  /**
   * The revision a key wrote, if it wrote one, and the document version (`textRef`) it carried: what the receiver's
   * lookup by key answers.
   */
  revisionOfKey(
    idempotencyKey: string,
  ): Promise<{ documentId: string; revision: number; textRef?: string } | undefined>;
  close(): Promise<void>;
}

/** The `fields` column as read: one JSON object, the steps' fields by name. */
const STEP_FIELDS = z.record(z.string(), z.unknown());

/** The two tables a SQLite file names otherwise, as the builder's plugin renames them (see schema.ts). */
const REVISIONS = sql.table('publication_revisions');
const DELIVERIES = sql.table('publication_deliveries');

/**
 * The publication database in either backend: one SQLite file, or PostgreSQL's tables. The idempotency key is
 * written in the same transaction as the revision it produced, so a key never writes twice, and a new key for a
 * known document (a workflow reset) becomes its next revision, unless its `scheduledAt` is older than that of the
 * publication already there: then it comes from a run a newer one replaced (a zombie worker still retrying, a
 * request that arrived late) and is answered as superseded, never written (see decidePublication).
 */
export class SqlPublicationStore implements PublicationStore {
  constructor(private readonly db: Sql) {}

  get where(): string {
    return this.db.dialect === 'sqlite' ? this.db.where : 'the PostgreSQL publications table';
  }

  async publish(publication: Publication, idempotencyKey: string): Promise<Receipt> {
    const { documentId } = publication;
    // Durable before the receipt is given, the disk synced aside from this thread (see Sql.transaction). Every
    // delivery writes its row, so a twin that finds this key's revision commits after it, and its own sync carries
    // the revision it read to disk before its receipt is given too.
    return this.db.transaction(
      async (tx) => {
        // One document's deliveries take turns until commit, so a race on a key or on the next revision number
        // resolves as it would one after the other (SQLite's write lock already serialises every transaction).
        await tx.lock(documentId);
        const seen = await tx.first(
          sql<{ document_id: string; revision: number }>`SELECT document_id, revision FROM ${REVISIONS}
          WHERE idempotency_key = ${idempotencyKey}`,
        );
        const latest = await tx.first(
          sql<{
            revision: number;
            scheduled_at: number | null;
            fields: unknown;
          }>`SELECT revision, scheduled_at, fields FROM publications
          WHERE document_id = ${documentId}`,
        );
        const decision = decidePublication(publication, seen, latest);
        const { receipt } = decision;
        if (decision.outcome === 'created' && latest !== undefined)
          receipt.changed = differs(STEP_FIELDS.parse(jsonOf(latest.fields)), stepFieldsOf(publication));
        const now = tx.now('text');
        if (decision.outcome === 'created') {
          await tx.run(
            sql`INSERT INTO ${REVISIONS} (document_id, revision, idempotency_key, payload, published_at)
            VALUES (${documentId}, ${receipt.revision}, ${idempotencyKey}, ${JSON.stringify(publication)}, ${now})`,
          );
          await tx.run(
            sql`INSERT INTO publications (document_id, revision, title, fields, updated_at, scheduled_at)
            VALUES (${documentId}, ${receipt.revision}, ${publication.title},
              ${JSON.stringify(stepFieldsOf(publication))}, ${now}, ${publication.scheduledAt ?? null})
            ON CONFLICT (document_id) DO UPDATE SET revision = excluded.revision, title = excluded.title,
              fields = excluded.fields, updated_at = excluded.updated_at,
              scheduled_at = coalesce(excluded.scheduled_at, publications.scheduled_at)`,
          );
        }
        await tx.run(
          sql`INSERT INTO ${DELIVERIES} (idempotency_key, document_id, outcome, received_at)
          VALUES (${idempotencyKey}, ${receipt.documentId}, ${decision.outcome}, ${now})`,
        );
        return receipt;
      },
      { syncAside: true },
    );
  }

  async countPublications(): Promise<number> {
    const row = await this.db.first(
      this.db.build.selectFrom('publications').select((eb) => eb.fn.countAll<number>().as('n')),
    );
    return Number(row?.n ?? 0);
  }

  async currentPublication(documentId: string): Promise<CurrentPublication | undefined> {
    const row = await this.db.first(
      this.db.build
        .selectFrom('publications')
        .select(['document_id', 'revision', 'title', 'fields', 'scheduled_at'])
        .where('document_id', '=', documentId),
    );
    if (row === undefined) return undefined;
    return {
      documentId: row.document_id,
      revision: row.revision,
      title: row.title,
      scheduledAt: row.scheduled_at,
      fields: STEP_FIELDS.parse(jsonOf(row.fields)),
    };
  }

  async revisionsOf(documentId: string): Promise<{ revision: number; idempotencyKey: string }[]> {
    const rows = await this.db.rows(
      this.db.build
        .selectFrom('publication_revisions')
        .select(['revision', 'idempotency_key'])
        .where('document_id', '=', documentId)
        .orderBy('revision'),
    );
    return rows.map((r) => ({ revision: r.revision, idempotencyKey: r.idempotency_key }));
  }

  async revisionOfKey(
    idempotencyKey: string,
  ): Promise<{ documentId: string; revision: number; textRef?: string } | undefined> {
    const row = await this.db.first(
      this.db.build
        .selectFrom('publication_revisions')
        .select(['document_id', 'revision', 'payload'])
        .where('idempotency_key', '=', idempotencyKey),
    );
    if (row === undefined) return undefined;
    // A sender acts on this answer as on a receipt: the revision may have been committed the moment before, its
    // sync still under way (see publish).
    await this.db.syncCommitted();
    const stored = z.object({ textRef: z.string() }).safeParse(jsonOf(row.payload));
    return {
      documentId: row.document_id,
      revision: row.revision,
      ...(stored.success ? { textRef: stored.data.textRef } : {}),
    };
  }

  async deliveries(): Promise<DeliveryRow[]> {
    const rows = await this.db.rows(
      this.db.build
        .selectFrom('publication_deliveries')
        .select(['idempotency_key', 'document_id', 'outcome', 'received_at'])
        .orderBy('id'),
    );
    return rows.map((r) => ({
      idempotencyKey: r.idempotency_key,
      documentId: r.document_id,
      outcome: r.outcome,
      receivedAt: dateOf(r.received_at).toISOString(),
    }));
  }

  close(): Promise<void> {
    return this.db.close();
  }
}

/** The publication database in one SQLite file (the built-in publish target without DATABASE_URL). */
export class SqlitePublicationStore extends SqlPublicationStore {
  constructor(file: string) {
    super(openSqlite(file, 'publications'));
  }
}

/**
 * What a delivery does, from what the store holds: a key seen before gets its first receipt back (`duplicate`); a
 * new key whose `scheduledAt` is older than the current publication's comes from a run a newer one replaced (a
 * zombie worker, a late request) and is answered with the current revision and `superseded: true` (`stale`);
 * any other new key writes the next revision (`created`). Without `scheduledAt` on either side a new key always
 * writes: publications from before the ordering existed. Both backends decide here.
 */
/**
 * Whether a new revision's fields differ from the previous revision's, the review's record aside (who decided,
 * and when, differs on every revision).
 */
function differs(before: Record<string, unknown>, after: Record<string, unknown>): boolean {
  const { review: _reviewBefore, ...was } = before;
  const { review: _reviewAfter, ...now } = after;
  return canonicalJson(was) !== canonicalJson(now);
}

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
