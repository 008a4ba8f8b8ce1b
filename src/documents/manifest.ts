/**
 * A batch's manifest in the blob store, in one place: the client writes it a page at a time, the workers read
 * ranges of it, and the sweep lists what it references. Up to a page of entries the manifest is that page
 * (`{ entries }`); above, it lists its pages by reference (`{ pages, pageSize, total }`), each page but the last
 * holding `pageSize` entries, so that no process ever holds the whole list.
 */
import type { z } from 'zod';
import { BatchManifestSchema, MANIFEST_PAGE_SIZE, ManifestPageSchema } from '../contract/batch';
import type { BatchEntry } from '../contract/batch';
import { parseOrFail } from '../contract';
import type { BlobStore } from './blobs';

/** Writes a manifest as entries are added: each full page is stored and let go. */
export class ManifestWriter {
  private page: BatchEntry[] = [];
  private readonly pages: string[] = [];
  private count = 0;

  constructor(
    private readonly blobs: BlobStore,
    private readonly pageSize = MANIFEST_PAGE_SIZE,
  ) {}

  /** Entries added so far. */
  get total(): number {
    return this.count;
  }

  async add(entry: BatchEntry): Promise<void> {
    if (this.page.length === this.pageSize) await this.storePage();
    this.page.push(entry);
    this.count += 1;
  }

  /**
   * Stores the manifest: its reference (undefined when no entry was added), and its entries when it is one page
   * (the batch lists a small batch's documents).
   */
  async finish(): Promise<{ manifestRef: string | undefined; entries: BatchEntry[] | undefined }> {
    if (this.count === 0) return { manifestRef: undefined, entries: undefined };
    // One page is its own manifest, as every manifest was before pages, so its batch keeps the ID it had.
    if (this.pages.length === 0)
      return { manifestRef: await this.put({ entries: this.page }), entries: this.page };
    await this.storePage();
    const manifestRef = await this.put({ pages: this.pages, pageSize: this.pageSize, total: this.count });
    return { manifestRef, entries: undefined };
  }

  private async storePage(): Promise<void> {
    this.pages.push(await this.put({ entries: this.page }));
    this.page = [];
  }

  private put(value: unknown): Promise<string> {
    return this.blobs.put(Buffer.from(JSON.stringify(value)));
  }
}

/** Manifests and pages a reader keeps parsed: a few batches' current pages. */
const KEPT_BLOBS = 8;

/**
 * Reads ranges of manifests for the batch workflow. A manifest and its pages never change (a reference is its
 * content's hash), so each is read and checked once and kept for the reads that follow: reading a manifest whole
 * for every range made a batch's reads grow with the square of its size. The last few are kept, for batches
 * running side by side. A manifest or page that is missing or malformed fails the read (not retryable).
 */
export class ManifestReader {
  private readonly kept = new Map<string, Promise<unknown>>();

  constructor(private readonly blobs: BlobStore) {}

  /** Entries [offset, offset + limit) of the manifest under `manifestRef`; fewer when the manifest holds fewer. */
  async range(manifestRef: string, offset: number, limit: number): Promise<BatchEntry[]> {
    const manifest = await this.parsed(manifestRef, BatchManifestSchema, 'batch manifest');
    if ('entries' in manifest) return manifest.entries.slice(offset, offset + limit);
    const end = Math.min(offset + limit, manifest.total);
    const out: BatchEntry[] = [];
    // The pages the range spans: a short page (only the last may be) ends the read, and the batch says so.
    for (let index = offset; index < end;) {
      const pageNumber = Math.floor(index / manifest.pageSize);
      const pageRef = manifest.pages[pageNumber];
      if (pageRef === undefined) break;
      const page = await this.parsed(
        pageRef,
        ManifestPageSchema,
        `page ${pageNumber + 1} of batch manifest ${manifestRef}`,
      );
      const from = index - pageNumber * manifest.pageSize;
      const taken = page.entries.slice(from, from + (end - index));
      if (taken.length === 0) break;
      out.push(...taken);
      index += taken.length;
    }
    return out;
  }

  private parsed<S extends z.ZodType>(ref: string, schema: S, what: string): Promise<z.output<S>> {
    let read = this.kept.get(ref) as Promise<z.output<S>> | undefined;
    if (read === undefined) {
      const reading = this.read(ref, schema, what);
      read = reading;
      // A failed read is not kept: the next range tries again.
      reading.catch(() => {
        if (this.kept.get(ref) === reading) this.kept.delete(ref);
      });
    }
    // Most recently used last: a batch's manifest stays while its pages come and go.
    this.kept.delete(ref);
    this.kept.set(ref, read);
    const oldest = this.kept.keys().next().value;
    if (this.kept.size > KEPT_BLOBS && oldest !== undefined) this.kept.delete(oldest);
    return read;
  }

  private async read<S extends z.ZodType>(ref: string, schema: S, what: string): Promise<z.output<S>> {
    const stored = await readJson(this.blobs, ref);
    if (stored === undefined) {
      throw new Error(
        `${what} ${ref} is not in ${this.blobs.where}; workers and clients must share ` +
          'one store (the same DATABASE_URL, or without it the same DATA_DIR)',
      );
    }
    return parseOrFail(schema, stored, what);
  }
}

/**
 * What a batch needs of this blob store: its manifest, the manifest's pages, and every document's text. The
 * client stores a batch's texts where it stores its manifest, so a manifest not in this store (a batch of
 * another store on the same server) means none of its texts are here either; a page not here is no longer the
 * batch's to read, nor its texts any run's. A blob that is no manifest (an input of another schema version) is
 * needed as it is.
 */
export async function manifestBlobRefs(blobs: BlobStore, manifestRef: string): Promise<string[]> {
  const stored = await readJson(blobs, manifestRef);
  if (stored === undefined) return [];
  const manifest = BatchManifestSchema.safeParse(stored);
  if (!manifest.success) return [manifestRef];
  if ('entries' in manifest.data) return [manifestRef, ...manifest.data.entries.map((e) => e.textRef)];
  const refs = [manifestRef, ...manifest.data.pages];
  for (const pageRef of manifest.data.pages) {
    const page = ManifestPageSchema.safeParse(await readJson(blobs, pageRef));
    if (page.success) refs.push(...page.data.entries.map((e) => e.textRef));
  }
  return refs;
}

/** A stored blob as JSON: undefined when the store does not have it, null when it is not JSON. */
async function readJson(blobs: BlobStore, ref: string): Promise<unknown> {
  const bytes = await blobs.get(ref);
  if (bytes === undefined) return undefined;
  try {
    return JSON.parse(bytes.toString('utf8')) as unknown;
  } catch {
    return null;
  }
}
