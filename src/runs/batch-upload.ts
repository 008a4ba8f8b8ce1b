import { createHash } from 'node:crypto';
import type { BatchEntry } from '../contract/batch';
import type { Config } from '../config';
import type { BlobStore } from '../documents/blobs';
import { eachDocument, versionOf } from '../documents/files';
import { ManifestWriter } from '../documents/manifest';
import { failedOutcome } from './result-table';
import type { DocumentOutcome } from './result-table';

/**
 * Reads and stores each document, a few stores in flight at a time, and lets its bytes go once stored; then its
 * entry goes into the manifest page under way, and each full page is stored and let go. What the client holds
 * does not grow with the batch: one page of entries, the pages' references (one per MANIFEST_PAGE_SIZE
 * documents), and a short digest per document to know the same version of a document named twice (one entry).
 * `entries` are the batch's, when it fits in one page.
 */
export async function storeDocuments(
  config: Config,
  blobs: BlobStore,
  paths: readonly string[],
  options: { concurrency: number; pageSize: number | undefined; signal: AbortSignal | undefined },
): Promise<{
  manifestRef: string | undefined;
  total: number;
  entries: BatchEntry[] | undefined;
  rejected: DocumentOutcome[];
}> {
  const { concurrency, pageSize, signal } = options;
  const manifest = new ManifestWriter(blobs, pageSize);
  const rejected: DocumentOutcome[] = [];
  const seen = new Set<string>();
  const inFlight = new Set<Promise<void>>();
  let failure: unknown;
  const folders = { idSecret: config.documentIdSecret, extensions: config.documentExtensions };
  for (const item of eachDocument(paths, config.maxDocumentBytes, folders)) {
    if ('rejected' in item) {
      rejected.push(failedOutcome(item.rejected.source, undefined, item.rejected.reason));
      continue;
    }
    const { document } = item;
    const textRef = versionOf(document.bytes);
    const key = createHash('sha256')
      .update(`${document.documentId} ${textRef}`)
      .digest('base64url')
      .slice(0, 22);
    if (seen.has(key)) continue;
    seen.add(key);
    const stored: Promise<void> = blobs.put(document.bytes).then(
      () => void inFlight.delete(stored),
      (err: unknown) => {
        failure ??= err;
        inFlight.delete(stored);
      },
    );
    inFlight.add(stored);
    await manifest.add({
      documentId: document.documentId,
      textRef,
      title: document.title,
      source: document.source,
    });
    if (inFlight.size >= concurrency) await Promise.race(inFlight);
    if (failure !== undefined || signal?.aborted === true) break;
  }
  await Promise.all(inFlight);
  if (failure !== undefined) throw failure;
  signal?.throwIfAborted();
  return { ...(await manifest.finish()), total: manifest.total, rejected };
}
