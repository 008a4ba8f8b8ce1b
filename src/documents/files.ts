import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { blobRefOf } from './blobs';

/** File endings picked up when a folder is given. */
const DOCUMENT_EXTENSIONS = new Set(['.md', '.markdown', '.txt']);

export type Decoded = { ok: true; text: string } | { ok: false; reason: string };

/**
 * Checks that bytes are a usable text document: not empty, within the size limit, UTF-8, no NUL bytes.
 * The reason, when it fails, says what to fix.
 */
export function decodeDocument(bytes: Uint8Array, maxBytes: number): Decoded {
  if (bytes.byteLength === 0) return { ok: false, reason: 'the file is empty; give it some text' };
  if (bytes.byteLength > maxBytes) return { ok: false, reason: tooBig(bytes.byteLength, maxBytes) };
  const nul = bytes.indexOf(0);
  if (nul !== -1) {
    return {
      ok: false,
      reason: `it holds a NUL byte at offset ${nul}: it looks binary; give a UTF-8 text file`,
    };
  }
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    return { ok: false, reason: 'it is not valid UTF-8; convert it (e.g. iconv -t UTF-8) and try again' };
  }
  if (text.trim() === '') return { ok: false, reason: 'it holds only white space; give it some text' };
  return { ok: true, text };
}

function tooBig(size: number, maxBytes: number): string {
  return `the file is ${size} bytes, over the ${maxBytes}-byte limit; split it or raise MAX_DOCUMENT_BYTES`;
}

export interface DocumentFile {
  /** Where it was read from, as given (for messages and the result table). */
  source: string;
  /**
   * Who the document is, whatever its text: documentIdOf its path for files collected here, or any ID a caller
   * sets (DocumentIdSchema). Each version of the text is a revision of this one document.
   */
  documentId: string;
  title: string;
  bytes: Buffer;
}

export interface Rejected {
  source: string;
  reason: string;
}

/**
 * Expands files and folders into documents, each identified by its path (documentIdOf, relative to `root`).
 * Nothing is dropped silently: every argument that is not a usable document comes back in `rejected` with the
 * reason.
 */
export function collectDocuments(
  args: readonly string[],
  maxBytes: number,
  { root = process.cwd() }: { root?: string } = {},
): { documents: DocumentFile[]; rejected: Rejected[] } {
  const documents: DocumentFile[] = [];
  const rejected: Rejected[] = [];
  const consider = (file: string): void => {
    let bytes: Buffer;
    try {
      // Sized before it is read: an over-size file is refused without loading it (past 2 GiB Node cannot).
      const { size } = fs.statSync(file);
      if (size > maxBytes) {
        rejected.push({ source: file, reason: tooBig(size, maxBytes) });
        return;
      }
      bytes = fs.readFileSync(file);
    } catch (err) {
      // A dangling symlink (an editor's lock file such as `.#notes.md`, say) or an unreadable file.
      const code = err instanceof Error && 'code' in err ? ` (${String(err.code)})` : '';
      rejected.push({ source: file, reason: `it cannot be read${code}; check the file or its link target` });
      return;
    }
    const decoded = decodeDocument(bytes, maxBytes);
    if (!decoded.ok) {
      rejected.push({ source: file, reason: decoded.reason });
      return;
    }
    documents.push({
      source: file,
      documentId: documentIdOf(file, root),
      title: titleOf(decoded.text, file),
      bytes,
    });
  };
  for (const arg of args) {
    let stat: fs.Stats;
    try {
      stat = fs.statSync(arg);
    } catch {
      rejected.push({ source: arg, reason: 'no such file or folder; check the path' });
      continue;
    }
    if (stat.isDirectory()) {
      const files = listDocumentFiles(arg);
      if (files.length === 0) {
        rejected.push({
          source: arg,
          reason: `the folder holds no ${[...DOCUMENT_EXTENSIONS].join(', ')} files`,
        });
      }
      files.forEach(consider);
    } else if (stat.isFile()) {
      consider(arg);
    } else {
      rejected.push({ source: arg, reason: 'not a regular file or folder' });
    }
  }
  return { documents, rejected };
}

/** A path that is a document ID as it stands, once its folders are separated by ':' instead of '/'. */
const PLAIN_PATH = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$/;
/** Hex digits of the path's hash in an ID the path does not fit as it stands. */
const HASH_HEX = 12;

/**
 * A document's identity from its path, so it survives edits: the path relative to `root` (the current folder
 * unless given), folders separated by ':', so `docs/guide.md` is `docs:guide.md`. A path that does not fit
 * DocumentIdSchema that way (other characters, a ':' of its own, a leading '.', as in `../notes.md`, or over 128
 * characters) keeps a readable tail and gets `::` and a hash of the path: `docs:my-draft.md::1f2e3d4c5b6a`. A
 * relative path has no empty folder names, so a plain ID never holds `::`: two paths never share an ID. The same
 * file named from another folder, or through a link, is another document.
 */
export function documentIdOf(file: string, root = process.cwd()): string {
  const relative = path.relative(root, path.resolve(file)).split(path.sep).join('/');
  if (PLAIN_PATH.test(relative)) return relative.replaceAll('/', ':');
  const hash = createHash('sha256').update(relative).digest('hex').slice(0, HASH_HEX);
  const readable = relative
    .replace(/[^A-Za-z0-9._/-]/g, '-')
    .replaceAll('/', ':')
    .slice(-(128 - 2 - HASH_HEX))
    .replace(/^[^A-Za-z0-9]+/, '');
  return `${readable || 'file'}::${hash}`;
}

/** A document's version: the hash of its content, which is also the reference its text is stored under. */
export function versionOf(bytes: Uint8Array): string {
  return blobRefOf(bytes);
}

/** The first Markdown heading, else the file name. */
export function titleOf(text: string, file: string): string {
  const heading = /^#{1,6}\s+(.+?)\s*#*\s*$/m.exec(text)?.[1];
  return (heading ?? path.basename(file)).slice(0, 300);
}

function listDocumentFiles(dir: string): string[] {
  return fs
    .readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .map((entry) => path.join(dir, entry))
    .filter((file) => DOCUMENT_EXTENSIONS.has(path.extname(file).toLowerCase()) && isFileOrBroken(file))
    .sort();
}

/** A regular file, or a path that cannot be stat'ed (a dangling link): kept, so reading it reports the problem. */
function isFileOrBroken(file: string): boolean {
  try {
    return fs.statSync(file).isFile();
  } catch {
    return true;
  }
}
