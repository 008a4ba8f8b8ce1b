import { ApplicationFailure } from '@temporalio/activity';
import type { BlobStore } from './blobs';
import { decodeDocument } from './files';
import { FailureType } from '../contract';

/** Where steps read a document's text from, by reference. */
export interface TextSource {
  read(textRef: string): Promise<string>;
}

/** How many characters of recently read texts a worker keeps (about 16 MiB at most). */
const RECENT_CHARS = 8 * 2 ** 20;

/**
 * Reads texts from the blob store, failing without retry (and saying what to fix) when one is unusable.
 *
 * A reference names its content (its hash), so a text once read and checked is the same text for good: the worker
 * keeps the latest ones, up to RECENT_CHARS. Summarize and tag start together and read the same text, and a
 * retried step reads it again: each then reads, hashes and decodes it once, and two reads at once share one.
 * Failures are not kept, so a text stored after a failed read is found by the next.
 */
export function blobTextSource(blobs: BlobStore, maxBytes: number, keepChars = RECENT_CHARS): TextSource {
  const recent = new Map<string, { text: Promise<string>; chars: number }>();
  let chars = 0;
  const forget = (textRef: string): void => {
    const entry = recent.get(textRef);
    if (entry === undefined) return;
    recent.delete(textRef);
    chars -= entry.chars;
  };
  const load = async (textRef: string): Promise<string> => {
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
  };
  return {
    read(textRef) {
      const kept = recent.get(textRef);
      if (kept !== undefined) {
        // Most recently used last: the oldest go first.
        recent.delete(textRef);
        recent.set(textRef, kept);
        return kept.text;
      }
      const entry = { text: load(textRef), chars: 0 };
      recent.set(textRef, entry);
      entry.text.then(
        (text) => {
          if (recent.get(textRef) !== entry) return;
          entry.chars = text.length;
          chars += text.length;
          for (const ref of recent.keys()) {
            if (chars <= keepChars || ref === textRef) break;
            forget(ref);
          }
        },
        () => {
          if (recent.get(textRef) === entry) forget(textRef);
        },
      );
      return entry.text;
    },
  };
}
