/**
 * Reading documents from the command line: what counts as a usable text, how folders expand, and that every
 * argument comes back either as a document or as a rejection with a reason, never dropped.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { collectDocuments, decodeDocument, documentIdFor, titleOf } from '../src/documents/files';
import { DocumentIdSchema } from '../src/contract';
import { cleanupAfterAll, scratchDir } from './helpers';

const LIMIT = 1_000;

const defer = cleanupAfterAll();

/** A temp folder holding `files` (relative path -> content). */
function folder(files: Record<string, string | Uint8Array>): string {
  const dir = scratchDir(defer, 'documents-test-');
  for (const [name, content] of Object.entries(files)) {
    const full = path.join(dir, name);
    fs.mkdirSync(path.dirname(full), { recursive: true });
    fs.writeFileSync(full, content);
  }
  return dir;
}

/** The reason decodeDocument refuses `bytes`; fails the test when it accepts them. */
function refusal(bytes: Uint8Array, maxBytes = LIMIT): string {
  const decoded = decodeDocument(bytes, maxBytes);
  assert.equal(decoded.ok, false, 'the bytes were accepted');
  return decoded.ok ? '' : decoded.reason;
}

describe('decodeDocument', () => {
  it('accepts UTF-8 text, multibyte characters included', () => {
    assert.deepEqual(decodeDocument(Buffer.from('# Café\n\nnaïve ✓'), LIMIT), {
      ok: true,
      text: '# Café\n\nnaïve ✓',
    });
  });

  it('refuses an empty file, asking for text', () => {
    assert.match(refusal(new Uint8Array()), /empty; give it some text/);
  });

  it('refuses white space only, asking for text', () => {
    assert.match(refusal(Buffer.from(' \n\t\r\n ')), /only white space; give it some text/);
  });

  it('refuses NUL bytes, saying where and that it looks binary', () => {
    assert.match(
      refusal(Buffer.from([0x61, 0x62, 0x00, 0x63])),
      /NUL byte at offset 2.*give a UTF-8 text file/,
    );
  });

  it('refuses invalid UTF-8, saying to convert it', () => {
    // Latin-1 "café": 0xe9 alone is not UTF-8.
    assert.match(refusal(Buffer.from([0x63, 0x61, 0x66, 0xe9])), /not valid UTF-8; convert it/);
  });

  it('refuses a file over the limit, naming both sizes and MAX_DOCUMENT_BYTES', () => {
    const reason = refusal(Buffer.alloc(LIMIT + 1, 'a'));
    assert.match(reason, new RegExp(`${LIMIT + 1} bytes, over the ${LIMIT}-byte limit`));
    assert.match(reason, /MAX_DOCUMENT_BYTES/);
    assert.equal(decodeDocument(Buffer.alloc(LIMIT, 'a'), LIMIT).ok, true, 'exactly the limit is allowed');
  });
});

describe('collectDocuments', () => {
  it('expands folders recursively, keeping only .md and .txt files', () => {
    const dir = folder({
      'a.md': '# Alpha\n\nText.',
      'nested/deeper/b.txt': 'Beta text.',
      'notes.pdf': 'not a document',
      'image.png': 'binary',
      'nested/c.json': '{}',
    });

    const { documents, rejected } = collectDocuments([dir], LIMIT);

    assert.deepEqual(
      documents.map((d) => path.relative(dir, d.source)),
      ['a.md', path.join('nested', 'deeper', 'b.txt')],
    );
    assert.deepEqual(rejected, []);
    assert.equal(documents[0]?.title, 'Alpha');
    assert.equal(documents[1]?.title, 'b.txt');
    assert.deepEqual(documents[1]?.bytes, Buffer.from('Beta text.'));
  });

  it('reports missing paths, empty folders and unusable files as rejected, with reasons', () => {
    const docs = folder({ 'good.md': 'Fine.', 'empty.md': '' });
    const noDocuments = folder({ 'readme.pdf': 'x' });
    const missing = path.join(docs, 'does-not-exist.md');

    const { documents, rejected } = collectDocuments([docs, noDocuments, missing], LIMIT);

    assert.deepEqual(
      documents.map((d) => path.basename(d.source)),
      ['good.md'],
    );
    assert.deepEqual(rejected, [
      { source: path.join(docs, 'empty.md'), reason: 'the file is empty; give it some text' },
      { source: noDocuments, reason: 'the folder holds no .md, .markdown, .txt files' },
      { source: missing, reason: 'no such file or folder; check the path' },
    ]);
  });

  it('reports a dangling symlink in a folder (an editor lock file) instead of failing the whole batch', () => {
    const dir = folder({ 'notes.md': 'Notes.' });
    const lock = path.join(dir, '.#notes.md');
    fs.symlinkSync('user@host.12345:1700000000', lock);

    const { documents, rejected } = collectDocuments([dir], LIMIT);

    assert.deepEqual(
      documents.map((d) => path.basename(d.source)),
      ['notes.md'],
    );
    assert.equal(rejected.length, 1);
    assert.equal(rejected[0]?.source, lock);
    assert.match(rejected[0]?.reason ?? '', /cannot be read \(ENOENT\); check the file or its link target/);
  });

  it('takes a file given directly whatever its ending', () => {
    const dir = folder({ 'notes.rst': 'Plain notes.' });
    const file = path.join(dir, 'notes.rst');

    const { documents, rejected } = collectDocuments([file], LIMIT);

    assert.deepEqual(
      documents.map((d) => d.source),
      [file],
    );
    assert.deepEqual(rejected, []);
  });
});

describe('documentIdFor', () => {
  it('is the same for the same bytes, wherever they come from', () => {
    const dir = folder({ 'one.md': 'Same text.', 'copy/two.txt': 'Same text.' });
    const { documents } = collectDocuments([dir], LIMIT);

    assert.equal(documents.length, 2);
    assert.equal(documents[0]?.documentId, documents[1]?.documentId);
    assert.equal(documentIdFor(Buffer.from('Same text.')), documents[0]?.documentId);
  });

  it('differs when a single byte differs', () => {
    assert.notEqual(documentIdFor(Buffer.from('Same text.')), documentIdFor(Buffer.from('Same text!')));
  });

  it('is a valid workflow document ID', () => {
    assert.equal(DocumentIdSchema.safeParse(documentIdFor(Buffer.from('anything'))).success, true);
  });
});

describe('titleOf', () => {
  it('picks the first Markdown heading, whatever its level', () => {
    assert.equal(
      titleOf('Intro line.\n\n## Second-level first\n\n# Later top level\n', 'x.md'),
      'Second-level first',
    );
  });

  it('drops closing hashes of an ATX heading', () => {
    assert.equal(titleOf('# Durable runs ##\n\nText.', 'x.md'), 'Durable runs');
  });

  it('falls back to the file name when there is no heading', () => {
    assert.equal(titleOf('No heading here.\n#hashtag is not one', '/docs/notes.txt'), 'notes.txt');
  });
});
