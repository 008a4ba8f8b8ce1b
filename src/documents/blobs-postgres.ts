import { z } from 'zod';
import type { Pool } from '../lib/postgres';
import { blobRefOf, verifyBlob } from './blobs';
import type { BlobStore } from './blobs';

/** Blobs as rows of the shared PostgreSQL database, so a client and workers on different hosts see one store. */
export class PostgresBlobStore implements BlobStore {
  readonly where = 'the PostgreSQL blobs table';

  constructor(private readonly pool: Pool) {}

  /** Stored again, a blob's age restarts: the sweep counts from its last submission. */
  async put(bytes: Uint8Array): Promise<string> {
    const ref = blobRefOf(bytes);
    await this.pool.query(
      'INSERT INTO blobs (ref, bytes) VALUES ($1, $2) ON CONFLICT (ref) DO UPDATE SET created_at = now()',
      [ref, Buffer.from(bytes)],
    );
    return ref;
  }

  async get(ref: string): Promise<Buffer | undefined> {
    const result = await this.pool.query('SELECT bytes FROM blobs WHERE ref = $1', [ref]);
    const row = z.array(z.object({ bytes: z.instanceof(Buffer) })).parse(result.rows)[0];
    return row === undefined ? undefined : verifyBlob(ref, row.bytes, this.where);
  }

  async sweep(before: Date, keep: ReadonlySet<string>): Promise<number> {
    const result = await this.pool.query(
      'DELETE FROM blobs WHERE created_at < $1 AND NOT (ref = ANY($2::text[]))',
      [before, [...keep]],
    );
    return result.rowCount ?? 0;
  }
}
