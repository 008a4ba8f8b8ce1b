import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { FailureType } from '../contract';

/**
 * Content-addressed store for document texts. Workflow inputs carry the `sha256:<hex>` reference, never the
 * text: histories stay small and the text is read by whichever worker runs the step.
 */
export interface BlobStore {
  /** Where the blobs are, for messages: a folder, or the database. */
  readonly where: string;
  /** Stores the bytes (idempotent: the same content always gets the same reference) and returns the reference. */
  put(bytes: Uint8Array): Promise<string>;
  /** The bytes behind a reference (their hash checked), or undefined when there is no such blob. */
  get(ref: string): Promise<Buffer | undefined>;
  /** Deletes blobs stored before `before` that `keep` does not name; returns how many. */
  sweep(before: Date, keep: ReadonlySet<string>): Promise<number>;
}

/** The reference of some bytes: `sha256:<hex>`. */
export function blobRefOf(bytes: Uint8Array): string {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

/** Refuses bytes whose hash is not the one their reference names (a damaged file or row). */
export function verifyBlob(ref: string, bytes: Buffer, where: string): Buffer {
  const actual = blobRefOf(bytes);
  if (actual !== ref) {
    throw ApplicationFailure.create({
      type: FailureType.InvalidDocument,
      nonRetryable: true,
      message: `blob ${ref} is corrupt in ${where} (its hash is ${actual}): delete it and submit the document again`,
    });
  }
  return bytes;
}

/** Blobs as files under one folder of this machine (the default without DATABASE_URL). */
export class FileBlobStore implements BlobStore {
  constructor(private readonly dir: string) {}

  get where(): string {
    return this.dir;
  }

  // async although the file calls are not: a failure (a damaged blob, a full disk) then rejects the promise, as
  // in every BlobStore, instead of throwing at the call.
  async put(bytes: Uint8Array): Promise<string> {
    const ref = blobRefOf(bytes);
    const file = this.pathOf(ref);
    try {
      // Stored again: the sweep counts a blob's age from its last submission.
      const now = new Date();
      fs.utimesSync(file, now, now);
    } catch {
      // Not there (or swept a moment ago): write it. Write then rename, so a crash never leaves a half-written
      // blob under a valid name.
      fs.mkdirSync(path.dirname(file), { recursive: true });
      const tmp = `${file}.${process.pid}.tmp`;
      fs.writeFileSync(tmp, bytes);
      fs.renameSync(tmp, file);
    }
    return ref;
  }

  async get(ref: string): Promise<Buffer | undefined> {
    const file = this.pathOf(ref);
    if (!fs.existsSync(file)) return undefined;
    return verifyBlob(ref, fs.readFileSync(file), file);
  }

  async sweep(before: Date, keep: ReadonlySet<string>): Promise<number> {
    let removed = 0;
    if (!fs.existsSync(this.dir)) return 0;
    for (const entry of fs.readdirSync(this.dir, { recursive: true, encoding: 'utf8' })) {
      const file = path.join(this.dir, entry);
      const name = path.basename(file);
      const hex = /^([0-9a-f]{64})(\.\d+\.tmp)?$/.exec(name)?.[1];
      // A `.tmp` file is what a crash left halfway through a write: old ones go too.
      if (hex === undefined || (name === hex && keep.has(`sha256:${hex}`))) continue;
      const stat = fs.statSync(file, { throwIfNoEntry: false });
      if (stat?.isFile() === true && stat.mtime < before) {
        fs.rmSync(file, { force: true });
        removed += 1;
      }
    }
    return removed;
  }

  private pathOf(ref: string): string {
    const hex = ref.replace(/^sha256:/, '');
    return path.join(this.dir, hex.slice(0, 2), hex);
  }
}
