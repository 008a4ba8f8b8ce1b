import { ApplicationFailure } from '@temporalio/activity';
import type { BlobStore } from './blobs';
import { decodeDocument } from './files';
import { FailureType } from '../contract';

/** Where steps read a document's text from, by reference. */
export interface TextSource {
  read(textRef: string): Promise<string>;
}

/** Reads texts from the blob store, failing without retry (and saying what to fix) when one is unusable. */
export function blobTextSource(blobs: BlobStore, maxBytes: number): TextSource {
  return {
    async read(textRef) {
      const bytes = await blobs.get(textRef);
      if (bytes === undefined) {
        throw ApplicationFailure.create({
          type: FailureType.InvalidDocument,
          nonRetryable: true,
          message:
            `document text ${textRef} is not in ${blobs.where}; workers and clients must share one store ` +
            '(the same DATABASE_URL, or without it the same DATA_DIR), then submit the document again',
        });
      }
      const decoded = decodeDocument(bytes, maxBytes);
      if (!decoded.ok) {
        throw ApplicationFailure.create({
          type: FailureType.InvalidDocument,
          nonRetryable: true,
          message: `document ${textRef} cannot be processed: ${decoded.reason}`,
        });
      }
      return decoded.text;
    },
  };
}
