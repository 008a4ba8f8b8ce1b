import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { FailureType } from '../contract';

/**
 * Content-addressed store for document texts. Workflow inputs carry the `sha256:<hex>` reference, never the
 * text: histories stay small and the text is read by whichever worker runs the step.
 */
export class BlobStore {
  constructor(private readonly dir: string) {}

  /** Stores the bytes (idempotent: the same content always lands on the same path) and returns its reference. */
  put(bytes: Uint8Array): string {
    const hex = createHash('sha256').update(bytes).digest('hex');
    const file = this.pathOf(hex);
    if (!fs.existsSync(file)) {
      fs.mkdirSync(path.dirname(file), { recursive: true });
      // Write then rename, so a crash never leaves a half-written blob under a valid name.
      const tmp = `${file}.${process.pid}.tmp`;
      fs.writeFileSync(tmp, bytes);
      fs.renameSync(tmp, file);
    }
    return `sha256:${hex}`;
  }

  /** Returns the bytes behind a reference, or undefined when no such blob exists; verifies the hash. */
  get(ref: string): Buffer | undefined {
    const hex = ref.replace(/^sha256:/, '');
    const file = this.pathOf(hex);
    if (!fs.existsSync(file)) return undefined;
    const bytes = fs.readFileSync(file);
    const actual = createHash('sha256').update(bytes).digest('hex');
    if (actual !== hex) {
      throw ApplicationFailure.create({
        type: FailureType.InvalidDocument,
        nonRetryable: true,
        message: `blob ${ref} is corrupt on disk (its hash is ${actual}): delete ${file} and submit the document again`,
      });
    }
    return bytes;
  }

  private pathOf(hex: string): string {
    return path.join(this.dir, hex.slice(0, 2), hex);
  }
}
