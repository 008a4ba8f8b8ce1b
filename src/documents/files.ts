import { createHash, createHmac } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { blobRefOf } from './blobs';
import { markdownTitle } from '../model/markdown';

/** File endings a folder is searched for unless DOCUMENT_EXTENSIONS names others. */
export const DEFAULT_DOCUMENT_EXTENSIONS: readonly string[] = ['.md', '.markdown', '.txt'];
/** Endings of Markdown, whose title is read from the text; any other ending is plain text, titled by its name. */
const MARKDOWN_EXTENSIONS = new Set(['.md', '.markdown']);
const EXTENSION = /^\.?([a-z0-9][a-z0-9_+-]*)$/;

/**
 * DOCUMENT_EXTENSIONS: the endings a folder is searched for, comma-separated, with or without the dot
 * (`.md,.rst` or `md, rst`), in any case; unset or empty, the defaults. The list replaces the defaults.
 */
export const DocumentExtensionsSchema = z
  .string()
  .optional()
  .transform((s, ctx) => {
    if (s === undefined || s.trim() === '') return DEFAULT_DOCUMENT_EXTENSIONS;
    const extensions = new Set<string>();
    for (const entry of s.split(',').map((part) => part.trim().toLowerCase())) {
      const ending = EXTENSION.exec(entry)?.[1];
      if (ending === undefined) {
        const what =
          entry === ''
            ? 'an empty entry (an extra comma)'
            : `"${entry}", which is no file ending (files are matched on what follows their last dot)`;
        ctx.addIssue({
          code: 'custom',
          message: `holds ${what}; list the endings separated by commas, e.g. .md,.markdown,.txt,.rst`,
        });
        return z.NEVER;
      }
      extensions.add(`.${ending}`);
    }
    return [...extensions];
  });
/** Open flag that refuses a link as the last part of the path (none on Windows, which has no such flag). */
const NO_FOLLOW = fs.constants.O_NOFOLLOW ?? 0;

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

/** One argument's document, or one thing among the arguments that is not a usable document, with why. */
export type Collected = { document: DocumentFile } | { rejected: Rejected };

export interface FolderOptions {
  /** What document IDs are relative to (the current folder). */
  root?: string;
  /** DOCUMENT_ID_SECRET: document IDs are keyed by it (documentIdOf). */
  idSecret?: string;
  /** The endings a folder is searched for (DEFAULT_DOCUMENT_EXTENSIONS); a file named itself is read anyway. */
  extensions?: readonly string[];
}

/**
 * Expands files and folders into documents, each identified by its path (documentIdOf, relative to `root`; keyed
 * by `idSecret` when given). Nothing is dropped silently: every argument that is not a usable document comes back
 * in `rejected` with the reason. A file named as an argument is read even through a link (the user named it); a
 * folder is read without leaving it (listFolder says how its links are treated).
 */
export function collectDocuments(
  args: readonly string[],
  maxBytes: number,
  options: FolderOptions = {},
): { documents: DocumentFile[]; rejected: Rejected[] } {
  const documents: DocumentFile[] = [];
  const rejected: Rejected[] = [];
  for (const item of eachDocument(args, maxBytes, options)) {
    if ('document' in item) documents.push(item.document);
    else rejected.push(item.rejected);
  }
  return { documents, rejected };
}

/**
 * collectDocuments one document at a time, in the same order: each file is read only when its turn comes, so a
 * caller that stores each text and lets it go holds one document at a time, however many the folders hold.
 */
export function* eachDocument(
  args: readonly string[],
  maxBytes: number,
  { root = process.cwd(), idSecret, extensions = DEFAULT_DOCUMENT_EXTENSIONS }: FolderOptions = {},
): Generator<Collected> {
  const endings = new Set(extensions);
  const consider = (source: string, readFrom: string, flags: number): Collected => {
    const read = readDocument(readFrom, flags, maxBytes);
    if (!read.ok) return { rejected: { source, reason: read.reason } };
    const decoded = decodeDocument(read.bytes, maxBytes);
    if (!decoded.ok) return { rejected: { source, reason: decoded.reason } };
    return {
      document: {
        source,
        documentId: documentIdOf(source, root, idSecret),
        title: titleOf(decoded.text, source),
        bytes: read.bytes,
      },
    };
  };
  for (const arg of args) {
    let stat: fs.Stats;
    try {
      stat = fs.statSync(arg);
    } catch {
      yield { rejected: { source: arg, reason: 'no such file or folder; check the path' } };
      continue;
    }
    if (stat.isDirectory()) {
      const entries = listFolder(arg, endings);
      if (entries.length === 0) {
        const listed = [...endings].join(', ');
        yield {
          rejected: {
            source: arg,
            reason: `the folder holds no ${listed} files; to read other endings, set DOCUMENT_EXTENSIONS (e.g. DOCUMENT_EXTENSIONS=.md,.rst)`,
          },
        };
      }
      for (const entry of entries) {
        yield 'reason' in entry ? { rejected: entry } : consider(entry.source, entry.readFrom, NO_FOLLOW);
      }
    } else if (stat.isFile()) {
      yield consider(arg, arg, 0);
    } else {
      yield { rejected: { source: arg, reason: 'not a regular file or folder' } };
    }
  }
}

/** Why a file could not be opened or read (a dangling link, no permission...), with the system's code. */
function unreadable(err: unknown): string {
  const code = err instanceof Error && 'code' in err ? ` (${String(err.code)})` : '';
  return `it cannot be read${code}; check the file or its link target`;
}

/**
 * The bytes of `file`, opened once with `flags`: what is checked is what is read, even if the folder changes
 * meanwhile. Sized before it is read, so an over-size file is refused without loading it (past 2 GiB Node cannot).
 */
function readDocument(
  file: string,
  flags: number,
  maxBytes: number,
): { ok: true; bytes: Buffer } | { ok: false; reason: string } {
  let fd: number;
  try {
    // O_NONBLOCK: opening a FIFO (or a device) blocks until a writer comes; this way it opens, and fstat refuses it.
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK | flags);
  } catch (err) {
    return { ok: false, reason: unreadable(err) };
  }
  try {
    const stat = fs.fstatSync(fd);
    if (!stat.isFile()) return { ok: false, reason: 'not a regular file' };
    if (stat.size > maxBytes) return { ok: false, reason: tooBig(stat.size, maxBytes) };
    return { ok: true, bytes: fs.readFileSync(fd) };
  } catch (err) {
    return { ok: false, reason: unreadable(err) };
  } finally {
    fs.closeSync(fd);
  }
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
 *
 * With a `secret` (DOCUMENT_ID_SECRET) the ID is `doc-` and the HMAC-SHA256 of that relative path under the
 * secret, in hex: stable across runs and distinct per path, but nothing in it (a workflow ID, the Web UI, a
 * history) can be read or guessed back to the path without the secret.
 */
export function documentIdOf(file: string, root = process.cwd(), secret?: string): string {
  const relative = path.relative(root, path.resolve(file)).split(path.sep).join('/');
  if (secret !== undefined) return `doc-${createHmac('sha256', secret).update(relative).digest('hex')}`;
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

/**
 * A document's title. Markdown (a file ending in .md or .markdown, or in nothing) is titled by its front matter's
 * `title:`, else by its first heading; plain text (any other ending: .txt, .rst, .adoc...) and Markdown with
 * neither, by the file name.
 */
export function titleOf(text: string, file: string): string {
  const ending = path.extname(file).toLowerCase();
  const title = ending === '' || MARKDOWN_EXTENSIONS.has(ending) ? markdownTitle(text) : undefined;
  return detached((title ?? path.basename(file)).slice(0, 300));
}

/**
 * A copy of `part` that holds nothing else. V8 makes a substring (a regex capture, a slice) a view into its
 * parent, which then lives as long as the substring: a batch keeps every document's title to the end, and titles
 * cut from the texts kept every text, 5 KB a document (a client reading 30,000 documents peaked at 250 MiB
 * instead of 125). Joining the characters builds a new string.
 */
function detached(part: string): string {
  return [...part].join('');
}

/** What a folder holds: a file to read (from `readFrom`), or one that is refused, with the reason. */
type FolderEntry = { source: string; readFrom: string } | Rejected;

/**
 * The documents (files with one of `endings`) of a folder and its subfolders, in path order, without ever
 * leaving it. Entries are looked at with lstat, so a link is seen as a link: a link to a folder is never descended
 * into (no loop, no escape through `..`) and is listed as refused; a link to a document outside the folder is refused, never read (a `notes.md`
 * pointing at a credentials file must not reach the model or the publish target); a link to a document inside
 * the folder is read, under the link's own path (another document, as documentIdOf says). Links to files are
 * looked at only with a document ending, like any file.
 */
function listFolder(dir: string, endings: ReadonlySet<string>): FolderEntry[] {
  const boundary = fs.realpathSync(dir);
  const entries: FolderEntry[] = [];
  const walk = (folder: string): void => {
    for (const name of fs.readdirSync(folder)) {
      const source = path.join(folder, name);
      const stat = fs.lstatSync(source);
      const isDocument = endings.has(path.extname(name).toLowerCase());
      if (stat.isDirectory()) {
        walk(source);
      } else if (stat.isSymbolicLink()) {
        const entry = throughLink(source, isDocument, dir, boundary);
        if (entry !== undefined) entries.push(entry);
      } else if (isDocument) {
        entries.push(stat.isFile() ? { source, readFrom: source } : { source, reason: 'not a regular file' });
      }
    }
  };
  walk(dir);
  return entries.sort((a, b) => (a.source < b.source ? -1 : a.source > b.source ? 1 : 0));
}

/**
 * What to do with the link `source` found in the folder `dir` (whose real path is `boundary`): read its target
 * (real path, so the check and the read agree), or refuse it. Undefined when it is not a document anyway.
 */
function throughLink(
  source: string,
  isDocument: boolean,
  dir: string,
  boundary: string,
): FolderEntry | undefined {
  let target: string;
  let isFolder: boolean;
  let isFile: boolean;
  try {
    target = fs.realpathSync(source);
    const stat = fs.statSync(target);
    isFolder = stat.isDirectory();
    isFile = stat.isFile();
  } catch (err) {
    // Dangling (an editor's lock file such as `.#notes.md`, say), or a loop of links.
    return isDocument ? { source, reason: unreadable(err) } : undefined;
  }
  if (!isFolder && !isDocument) return undefined;
  const what = isFolder ? 'folder' : 'file';
  const fromBoundary = path.relative(boundary, target);
  if (fromBoundary.split(path.sep)[0] === '..' || path.isAbsolute(fromBoundary)) {
    return {
      source,
      reason: `it is a link to a ${what} outside ${dir}, and links are not followed out of the folder given; name the ${what} itself to read it`,
    };
  }
  if (isFolder) {
    return {
      source,
      reason:
        'it is a link to a folder, and links to folders are not followed; name the folder itself to read it',
    };
  }
  if (!isFile)
    return { source, reason: 'it is a link to something that is not a regular file (a FIFO, a device)' };
  return { source, readFrom: target };
}
