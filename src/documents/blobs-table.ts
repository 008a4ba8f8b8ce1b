import { removeInBatches, safeToRepeat } from '../store/sql';
import type { Sql } from '../store/sql';
import { blobRefOf, verifyBlob } from './blobs';
import type { BlobStore } from './blobs';

/**
 * Blobs as rows of a database table: PostgreSQL's, so a client and workers on different hosts see one store (the
 * SQLite default keeps them as files, see FileBlobStore).
 */
export class TableBlobStore implements BlobStore {
  constructor(private readonly db: Sql) {}

  get where(): string {
    return `the ${this.db.where} blobs table`;
  }

  /**
   * Stored again, a blob's age restarts: the sweep counts from its last submission. Safe to repeat (the same bytes
   * under the same ref, the age restarted again), so an outage's retry sends it again as it is.
   */
  async put(bytes: Uint8Array): Promise<string> {
    const ref = blobRefOf(bytes);
    await this.db.run(
      safeToRepeat(
        this.db.build
          .insertInto('blobs')
          .values({ ref, bytes: Buffer.from(bytes), created_at: this.db.now() })
          .onConflict((conflict) => conflict.column('ref').doUpdateSet({ created_at: this.db.now() })),
      ),
    );
    return ref;
  }

  async get(ref: string): Promise<Buffer | undefined> {
    const row = await this.db.first(this.db.build.selectFrom('blobs').select('bytes').where('ref', '=', ref));
    return row === undefined ? undefined : verifyBlob(ref, Buffer.from(row.bytes), this.where);
  }

  async sweep(before: Date, keep: ReadonlySet<string>): Promise<number> {
    const old = this.db.time(before);
    const rows = await this.db.rows(
      this.db.build.selectFrom('blobs').select('ref').where('created_at', '<', old),
    );
    const refs = rows.map((row) => row.ref).filter((ref) => !keep.has(ref));
    return removeInBatches(refs, (batch) =>
      this.db.run(this.db.build.deleteFrom('blobs').where('ref', 'in', batch).where('created_at', '<', old)),
    );
  }
}
