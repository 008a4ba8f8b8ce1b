/**
 * Reading documents from the command line: what counts as a usable text, how folders expand, and that every
 * argument comes back either as a document or as a rejection with a reason, never dropped.
 */
import '../src/cli/compose';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHmac } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import v8 from 'node:v8';
import vm from 'node:vm';
import { Client } from '@temporalio/client';
import { collectDocuments, decodeDocument, documentIdOf, titleOf, versionOf } from '../src/documents/files';
import { blobRefOf, FileBlobStore } from '../src/documents/blobs';
import type { BlobStore } from '../src/documents/blobs';
import { blobTextSource } from '../src/documents/text-source';
import { ConfigError, loadConfig } from '../src/config';
import { DocumentIdSchema, workflowIdFor } from '../src/contract';
import { BatchInputSchema, ManifestPageSchema } from '../src/contract/batch';
import { processDocuments } from '../src/runs/batch';
import { cleanupAfterAll, scratchDir } from './scratch';

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
    assert.deepEqual(
      collectDocuments([dir], LIMIT, { root: dir }).documents.map((d) => d.documentId),
      ['a.md', 'nested:deeper:b.txt'],
    );
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
      {
        source: noDocuments,
        reason:
          'the folder holds no .md, .markdown, .txt files; to read other endings, set DOCUMENT_EXTENSIONS (e.g. DOCUMENT_EXTENSIONS=.md,.rst)',
      },
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
    assert.equal(
      documents[0]?.documentId,
      documentIdOf(file),
      'identified by its path, like the files of a folder',
    );
  });
});

describe('collectDocuments on links in a folder', () => {
  /** The paths, relative to `dir`, of the documents collected and of the sources refused. */
  const relativeTo = (dir: string, list: ReadonlyArray<{ source: string }>) =>
    list.map((d) => path.relative(dir, d.source));

  it('refuses a link to a file outside the folder without reading it, and reads it when named directly', () => {
    const outside = folder({ credentials: 'aws_secret_access_key = SECRET-CREDENTIAL' });
    const secret = path.join(outside, 'credentials');
    const dir = folder({ 'a.md': '# A\n\nText.' });
    fs.symlinkSync(secret, path.join(dir, 'notes.md'));
    fs.mkdirSync(path.join(dir, 'sub'));
    fs.symlinkSync(path.relative(path.join(dir, 'sub'), secret), path.join(dir, 'sub', 'keys.txt'));

    const { documents, rejected } = collectDocuments([dir], LIMIT);

    assert.deepEqual(relativeTo(dir, documents), ['a.md']);
    assert.deepEqual(relativeTo(dir, rejected), ['notes.md', path.join('sub', 'keys.txt')]);
    for (const { reason } of rejected) {
      assert.equal(
        reason,
        `it is a link to a file outside ${dir}, and links are not followed out of the folder given; ` +
          'name the file itself to read it',
      );
    }
    assert.ok(!documents.some((d) => d.bytes.includes('SECRET-CREDENTIAL')), 'the secret was read');

    const named = collectDocuments([path.join(dir, 'notes.md')], LIMIT);
    assert.deepEqual(named.rejected, [], "a link the user names is the user's choice");
    assert.deepEqual(
      named.documents.map((d) => d.bytes.toString()),
      ['aws_secret_access_key = SECRET-CREDENTIAL'],
    );
  });

  it('does not descend into a link to ".." or to its own folder: each document once, no loop', () => {
    const dir = folder({ 'a.md': 'Alpha.', 'sub/b.md': 'Beta.' });
    fs.symlinkSync('..', path.join(dir, 'up'));
    fs.symlinkSync('..', path.join(dir, 'sub', 'loop'));
    fs.symlinkSync(dir, path.join(dir, 'sub', 'again.md'));

    const { documents, rejected } = collectDocuments([dir], LIMIT);

    assert.deepEqual(relativeTo(dir, documents), ['a.md', path.join('sub', 'b.md')]);
    assert.deepEqual(
      rejected.map((r) => [path.relative(dir, r.source), r.reason]),
      [
        [
          path.join('sub', 'again.md'),
          'it is a link to a folder, and links to folders are not followed; name the folder itself to read it',
        ],
        [
          path.join('sub', 'loop'),
          'it is a link to a folder, and links to folders are not followed; name the folder itself to read it',
        ],
        [
          'up',
          `it is a link to a folder outside ${dir}, and links are not followed out of the folder given; ` +
            'name the folder itself to read it',
        ],
      ],
    );
  });

  it('reads a link to a document inside the folder under the link’s path, not a link to a folder inside it', () => {
    const real = folder({ 'docs/index.md': '# Index\n\nThe docs.', 'notes.rst': 'Plain notes.' });
    fs.symlinkSync(path.join('docs', 'index.md'), path.join(real, 'README.md'));
    fs.symlinkSync('notes.rst', path.join(real, 'notes.txt'));
    fs.symlinkSync('notes.rst', path.join(real, 'notes.bak'));
    fs.symlinkSync('docs', path.join(real, 'alias'));
    // The folder itself is named through a link: the user chose it, and "inside" means inside its target.
    const named = path.join(scratchDir(defer, 'documents-link-'), 'named');
    fs.symlinkSync(real, named);

    const { documents, rejected } = collectDocuments([named], LIMIT, { root: named });

    assert.deepEqual(
      documents.map((d) => [d.documentId, d.bytes.toString()]),
      [
        ['README.md', '# Index\n\nThe docs.'],
        ['docs:index.md', '# Index\n\nThe docs.'],
        ['notes.txt', 'Plain notes.'],
      ],
    );
    assert.deepEqual(rejected, [
      {
        source: path.join(named, 'alias'),
        reason:
          'it is a link to a folder, and links to folders are not followed; name the folder itself to read it',
      },
    ]);
  });

  it('reports a FIFO (or any other non-file) with a document ending instead of skipping it', () => {
    const dir = folder({ 'a.md': 'Alpha.' });
    execFileSync('mkfifo', [path.join(dir, 'pipe.md')]);

    const { documents, rejected } = collectDocuments([dir], LIMIT);

    assert.deepEqual(relativeTo(dir, documents), ['a.md']);
    assert.deepEqual(rejected, [{ source: path.join(dir, 'pipe.md'), reason: 'not a regular file' }]);
  });

  it('refuses a link to a FIFO, and a FIFO named directly, without blocking on it', () => {
    // Opening a FIFO for reading blocks until a writer comes, and would block this process's event loop: the
    // walk runs in a child with a deadline.
    const dir = folder({ 'a.md': 'Alpha.' });
    const fifo = path.join(dir, 'pipe'); // no document ending: the walk skips the FIFO itself, not the link to it
    execFileSync('mkfifo', [fifo]);
    fs.symlinkSync(fifo, path.join(dir, 'link.md'));
    const script = `
      const { collectDocuments } = require(${JSON.stringify(path.join(__dirname, '..', 'src', 'documents', 'files'))});
      const { documents, rejected } = collectDocuments(process.argv.slice(1), ${LIMIT});
      console.log(JSON.stringify({ documents: documents.map((d) => d.source), rejected }));
    `;
    const out = execFileSync(process.execPath, ['--import', 'tsx', '-e', script, dir, fifo], {
      encoding: 'utf8',
      timeout: 30_000,
    });
    const { documents, rejected } = JSON.parse(out) as {
      documents: string[];
      rejected: { source: string; reason: string }[];
    };
    assert.deepEqual(documents, [path.join(dir, 'a.md')]);
    assert.deepEqual(rejected, [
      {
        source: path.join(dir, 'link.md'),
        reason: 'it is a link to something that is not a regular file (a FIFO, a device)',
      },
      { source: fifo, reason: 'not a regular file or folder' },
    ]);
  });
});

/** Asserts that `id` is a valid document ID and returns it. */
function valid(id: string): string {
  const parsed = DocumentIdSchema.safeParse(id);
  assert.ok(parsed.success, `${JSON.stringify(id)}: ${parsed.error?.issues[0]?.message ?? ''}`);
  return id;
}

describe('documentIdOf', () => {
  it('is the path relative to the root, folders separated by ":"', () => {
    const root = path.join(path.sep, 'work', 'repo');

    assert.equal(documentIdOf(path.join(root, 'notes.md'), root), 'notes.md');
    assert.equal(
      documentIdOf(path.join(root, 'docs', 'guides', 'Setup_v2.md'), root),
      'docs:guides:Setup_v2.md',
    );
  });

  it('is the same however the path is spelled, and relative to the current folder by default', () => {
    const here = path.join('docs', 'guide.md');

    assert.equal(documentIdOf(here), 'docs:guide.md');
    assert.equal(documentIdOf(`./docs//guide.md`), 'docs:guide.md');
    assert.equal(documentIdOf(path.resolve(here)), 'docs:guide.md');
    assert.equal(documentIdOf(path.join('docs', 'old', '..', 'guide.md')), 'docs:guide.md');
  });

  it('survives edits: collected again after the text changed, the file keeps its ID', () => {
    const dir = folder({ 'notes.md': 'First draft.' });
    const [before] = collectDocuments([dir], LIMIT, { root: dir }).documents;
    fs.writeFileSync(path.join(dir, 'notes.md'), 'Second draft, much better.');
    const [after] = collectDocuments([path.join(dir, 'notes.md')], LIMIT, { root: dir }).documents;
    assert.ok(before !== undefined && after !== undefined, 'a draft was not collected');

    assert.equal(before.documentId, 'notes.md');
    assert.equal(after.documentId, 'notes.md');
    assert.notEqual(versionOf(before.bytes), versionOf(after.bytes), 'the edit is a new version');
  });

  it('tells apart files with the same text, and files whose names differ only where IDs cannot follow', () => {
    const dir = folder({
      'one.md': 'Same text.',
      'copy/one.md': 'Same text.',
      'copy:one.md': 'Same text.',
      'copy-one.md': 'Same text.',
      'my notes.md': 'Same text.',
      'my-notes.md': 'Same text.',
      'my_notes.md': 'Same text.',
      'café.md': 'Same text.',
      'cafè.md': 'Same text.',
    });

    const ids = collectDocuments([dir], LIMIT, { root: dir }).documents.map((d) => valid(d.documentId));

    assert.equal(ids.length, 9);
    assert.equal(new Set(ids).size, 9, `shared IDs among ${ids.join(', ')}`);
    assert.ok(ids.includes('copy:one.md'), 'a plain nested path keeps its plain ID');
    assert.ok(ids.includes('copy-one.md'));
    assert.ok(ids.includes('my-notes.md'));
  });

  it('keeps a readable tail and adds "::" and a hash when the path does not fit as it stands', () => {
    const root = path.join(path.sep, 'work', 'repo');
    const id = (relative: string) => valid(documentIdOf(path.join(root, relative), root));

    assert.match(id('my notes.md'), /^my-notes\.md::[0-9a-f]{12}$/);
    assert.match(id('copy:one.md'), /^copy-one\.md::[0-9a-f]{12}$/);
    assert.match(id('.hidden.md'), /^hidden\.md::[0-9a-f]{12}$/);
    assert.match(id('über/straße.md'), /^ber:stra-e\.md::[0-9a-f]{12}$/);
    assert.match(id('../elsewhere/notes.md'), /^elsewhere:notes\.md::[0-9a-f]{12}$/);
    assert.match(id('_'), /^file::[0-9a-f]{12}$/);
    assert.equal(id('my notes.md'), id('my notes.md'), 'the same path gets the same ID every time');
  });

  it('stays within 128 characters for very long paths, distinct and ending with the file name', () => {
    const root = path.join(path.sep, 'work', 'repo');
    const deep = Array.from({ length: 30 }, (_, i) => `folder-${i}`).join('/');
    const exactly = 'a'.repeat(128);
    const ids = [
      `${deep}/chapter-1.md`,
      `${deep}/chapter-2.md`,
      `x${deep}/chapter-1.md`,
      exactly,
      `${exactly}b`,
    ].map((relative) => valid(documentIdOf(path.join(root, relative), root)));

    assert.equal(new Set(ids).size, ids.length, `shared IDs among ${ids.join(', ')}`);
    assert.match(ids[0] ?? '', /chapter-1\.md::[0-9a-f]{12}$/);
    assert.equal(ids[3], exactly, 'a plain path of exactly 128 characters is its own ID');
    assert.ok(ids.every((id) => id.length <= 128));
  });

  it('is a valid document ID for any path', () => {
    const root = path.join(path.sep, 'work', 'repo');
    const odd = [
      '-x.md',
      '..',
      '../../../etc/passwd',
      'a\tb.md',
      '日本語/ノート.md',
      'x'.repeat(5_000),
      '%20.md',
    ];
    for (const relative of odd) valid(documentIdOf(path.join(root, relative), root));
  });
});

describe('keyed document IDs (DOCUMENT_ID_SECRET)', () => {
  const SECRET = 'a secret of the deployment';
  const root = path.join(path.sep, 'work', 'repo');
  const keyed = (relative: string, secret = SECRET) =>
    valid(documentIdOf(path.join(root, relative), root, secret));

  it('is "doc-" and the HMAC-SHA256 of the relative path under the secret, in hex', () => {
    const hmac = createHmac('sha256', SECRET).update('docs/guide.md').digest('hex');

    assert.equal(keyed(path.join('docs', 'guide.md')), `doc-${hmac}`);
    assert.equal(
      valid(documentIdOf(path.join('docs', 'guide.md'), undefined, SECRET)),
      `doc-${hmac}`,
      'relative to the current folder by default, as without a secret',
    );
  });

  it('is stable, distinct per path and per secret, and holds nothing of the path', () => {
    const paths = [
      'notes.md',
      'docs/notes.md',
      'docs:notes.md',
      'my notes.md',
      'x'.repeat(5_000),
      '../up.md',
    ];
    const ids = paths.map((p) => keyed(p));

    assert.deepEqual(
      paths.map((p) => keyed(p)),
      ids,
      'the same path gets the same ID every time',
    );
    assert.equal(new Set(ids).size, paths.length, `shared IDs among ${ids.join(', ')}`);
    assert.notEqual(keyed('notes.md', 'another secret'), keyed('notes.md'));
    for (const id of ids) {
      assert.match(id, /^doc-[0-9a-f]{64}$/);
      assert.doesNotMatch(id, /notes|docs|up|xxx/);
    }
  });

  it('keys every document collectDocuments finds when given the secret', () => {
    const dir = folder({ 'a.md': 'Alpha.', 'nested/b.txt': 'Beta.' });

    const { documents } = collectDocuments([dir], LIMIT, { root: dir, idSecret: SECRET });

    assert.deepEqual(
      documents.map((d) => d.documentId),
      [
        documentIdOf(path.join(dir, 'a.md'), dir, SECRET),
        documentIdOf(path.join(dir, 'nested', 'b.txt'), dir, SECRET),
      ],
    );
    assert.ok(documents.every((d) => /^doc-[0-9a-f]{64}$/.test(d.documentId)));
  });

  it('is what the batch command submits under when DOCUMENT_ID_SECRET is set', async () => {
    const dir = folder({ 'private/plans.md': '# Plans\n\nNot for everyone.' });
    const config = loadConfig({ DATA_DIR: path.join(dir, 'data'), DOCUMENT_ID_SECRET: SECRET }, dir);
    const blobs = new FileBlobStore(path.join(dir, 'blobs'));
    const started: { workflowId: string; input: unknown }[] = [];
    // Stops the batch at its first request to the server, once its ID and input are known.
    const client = new Client({
      interceptors: {
        workflow: [
          {
            start: (input) => {
              started.push({ workflowId: input.options.workflowId, input: input.options.args[0] });
              throw new Error('no server in this test');
            },
          },
        ],
      },
    });
    defer(() => client.connection.close());
    const source = path.join(dir, 'private', 'plans.md');

    await assert.rejects(
      processDocuments(client, config, blobs, [path.join(dir, 'private')], { print: () => {} }),
      /no server in this test/,
    );

    assert.equal(started.length, 1);
    const batchInput = BatchInputSchema.parse(started[0]?.input);
    const manifest = ManifestPageSchema.parse(
      JSON.parse((await blobs.get(batchInput.manifestRef))?.toString('utf8') ?? 'null'),
    );
    assert.deepEqual(
      manifest.entries.map((e) => e.documentId),
      [documentIdOf(source, process.cwd(), SECRET)],
    );
    // Neither the batch's ID nor its documents' IDs name the path; only the entry's source (for messages) does.
    assert.doesNotMatch(started[0]?.workflowId ?? '', /private|plans/);
    assert.doesNotMatch(workflowIdFor(manifest.entries[0]?.documentId ?? ''), /private|plans/);
  });
});

describe('DOCUMENT_EXTENSIONS', () => {
  const notMarkdown = {
    'guide.rst': 'Guide\n=====\n\nreStructuredText.',
    'manual.adoc': '= Manual\n\nAsciiDoc.',
    'nested/news.article': 'News of the day.',
    'LOUD.RST': 'Upper-case ending.',
    'notes.md': '# Notes\n\nMarkdown.',
  };

  it('is unset by default: a folder of other endings is refused, with the variable that widens it', () => {
    assert.deepEqual(loadConfig({}).documentExtensions, ['.md', '.markdown', '.txt']);
    const dir = folder({ 'guide.rst': 'Guide.', 'manual.adoc': 'Manual.', 'news.article': 'News.' });
    const { documents, rejected } = collectDocuments([dir], LIMIT);
    assert.deepEqual(documents, []);
    assert.equal(rejected.length, 1);
    assert.match(
      rejected[0]?.reason ?? '',
      /holds no \.md, \.markdown, \.txt files; .*set DOCUMENT_EXTENSIONS/,
    );
  });

  it('lists the endings a folder is searched for, with or without the dot, in any case, and only those', () => {
    const extensions = loadConfig({ DOCUMENT_EXTENSIONS: ' rst, .ADOC,.article,.rst ' }).documentExtensions;
    assert.deepEqual(extensions, ['.rst', '.adoc', '.article']);
    const dir = folder(notMarkdown);

    const { documents, rejected } = collectDocuments([dir], LIMIT, { extensions });

    assert.deepEqual(
      documents.map((d) => path.relative(dir, d.source)),
      ['LOUD.RST', 'guide.rst', 'manual.adoc', path.join('nested', 'news.article')],
    );
    assert.deepEqual(rejected, []);
    // Read as plain text: titled by the file name, whatever looks like a heading in it.
    assert.deepEqual(
      documents.map((d) => d.title),
      ['LOUD.RST', 'guide.rst', 'manual.adoc', 'news.article'],
    );
    const none = collectDocuments([folder({ 'a.md': 'A.' })], LIMIT, { extensions: ['.rst'] }).rejected;
    assert.match(none[0]?.reason ?? '', /holds no \.rst files/);
  });

  it('refuses a list it cannot read, naming the variable and what to write instead', () => {
    for (const [value, problem] of [
      ['.md,,.rst', /DOCUMENT_EXTENSIONS: holds an empty entry \(an extra comma\)/],
      ['.md,', /DOCUMENT_EXTENSIONS: holds an empty entry/],
      ['.tar.gz', /DOCUMENT_EXTENSIONS: holds "\.tar\.gz", which is no file ending/],
      ['*.md', /DOCUMENT_EXTENSIONS: holds "\*\.md", which is no file ending/],
      ['md rst', /DOCUMENT_EXTENSIONS: holds "md rst"/],
    ] as const) {
      assert.throws(
        () => loadConfig({ DOCUMENT_EXTENSIONS: value }),
        (err: unknown) =>
          err instanceof ConfigError &&
          problem.test(err.message) &&
          err.message.includes('separated by commas, e.g. .md,.markdown,.txt,.rst'),
        value,
      );
    }
    assert.deepEqual(loadConfig({ DOCUMENT_EXTENSIONS: '  ' }).documentExtensions, [
      '.md',
      '.markdown',
      '.txt',
    ]);
  });

  it('is what the batch command searches folders for', async () => {
    const dir = folder(notMarkdown);
    const config = loadConfig({ DATA_DIR: path.join(dir, 'data'), DOCUMENT_EXTENSIONS: '.adoc' }, dir);
    const blobs = new FileBlobStore(path.join(dir, 'blobs'));
    const started: unknown[] = [];
    // Stops the batch at its first request to the server, once its input is known.
    const client = new Client({
      interceptors: {
        workflow: [
          {
            start: (input) => {
              started.push(input.options.args[0]);
              throw new Error('no server in this test');
            },
          },
        ],
      },
    });
    defer(() => client.connection.close());

    await assert.rejects(
      processDocuments(client, config, blobs, [dir], { print: () => {} }),
      /no server in this test/,
    );

    const batchInput = BatchInputSchema.parse(started[0]);
    const manifest = ManifestPageSchema.parse(
      JSON.parse((await blobs.get(batchInput.manifestRef))?.toString('utf8') ?? 'null'),
    );
    assert.deepEqual(
      manifest.entries.map((e) => [path.relative(dir, e.source), e.title]),
      [['manual.adoc', 'manual.adoc']],
    );
  });
});

describe('versionOf', () => {
  it('is the content hash: the blob reference, the same for the same bytes wherever they come from', () => {
    assert.equal(versionOf(Buffer.from('Same text.')), blobRefOf(Buffer.from('Same text.')));
    assert.notEqual(versionOf(Buffer.from('Same text.')), versionOf(Buffer.from('Same text!')));
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
    assert.equal(titleOf('No heading here.\n#hashtag is not one', '/docs/notes.md'), 'notes.md');
  });

  it("takes front matter's title first, and never a comment in a code block", () => {
    const markdown = '---\ntitle: "Tides: a primer"\n---\n\n# Heading\n';
    assert.equal(titleOf(markdown, 'tides.md'), 'Tides: a primer');
    assert.equal(titleOf('```sh\n# install it\n```\n\nTides\n=====\n', 'x.markdown'), 'Tides');
    assert.equal(titleOf('```sh\n# install it\n```\n', 'install.md'), 'install.md');
  });

  it('titles plain text (.txt and other endings that are not Markdown) by the file name', () => {
    assert.equal(titleOf('# Not a heading in plain text\n', '/docs/notes.txt'), 'notes.txt');
    assert.equal(titleOf('Guide\n=====\n', 'guide.rst'), 'guide.rst');
    assert.equal(titleOf('# Chaos note 1\n\nText.', ''), 'Chaos note 1');
  });

  it('keeps only the title alive, not the text it was cut from (a batch keeps every title to its end)', () => {
    v8.setFlagsFromString('--expose-gc');
    const gc = vm.runInNewContext('gc') as () => void;
    gc();
    const before = process.memoryUsage().heapUsed;
    const titles: string[] = [];
    for (let i = 0; i < 200; i++) {
      titles.push(titleOf(`# The heading of document ${i}\n\n${'Durable text. '.repeat(15_000)}`, 'x.md'));
    }
    gc();
    const grownMiB = (process.memoryUsage().heapUsed - before) / 2 ** 20;
    // 200 texts of 210 KB: ~40 MiB if each title held on to its text, well under 1 MiB for the titles alone.
    assert.ok(grownMiB < 5, `the heap grew ${grownMiB.toFixed(1)} MiB for 200 titles`);
    assert.equal(titles[199], 'The heading of document 199');
  });
});

describe('blobTextSource', () => {
  /** A file blob store that counts its reads. */
  function countingStore(): { store: BlobStore; gets: string[] } {
    const files = new FileBlobStore(scratchDir(defer, 'texts-test-'));
    const gets: string[] = [];
    const store: BlobStore = Object.assign(Object.create(files) as BlobStore, {
      get: (ref: string) => {
        gets.push(ref);
        return files.get(ref);
      },
    });
    return { store, gets };
  }

  it('reads a text once for two reads at once and for a read after them (a reference names its content)', async () => {
    const { store, gets } = countingStore();
    const ref = await store.put(Buffer.from('# One\n\nThe same text for both model steps.\n'));
    const texts = blobTextSource(store, LIMIT);
    const [a, b] = await Promise.all([texts.read(ref), texts.read(ref)]);
    assert.equal(a, '# One\n\nThe same text for both model steps.\n');
    assert.equal(b, a);
    assert.equal(await texts.read(ref), a);
    assert.deepEqual(gets, [ref]);
  });

  it('keeps no failure: a text missing at one read and stored before the next is found', async () => {
    const { store, gets } = countingStore();
    const bytes = Buffer.from('Stored late.\n');
    const ref = blobRefOf(bytes);
    const texts = blobTextSource(store, LIMIT);
    await assert.rejects(texts.read(ref), /is not in .*submit the document again/);
    await store.put(bytes);
    assert.equal(await texts.read(ref), 'Stored late.\n');
    assert.deepEqual(gets, [ref, ref]);
  });

  it('keeps the latest texts up to its limit, the least recently read going first', async () => {
    const { store, gets } = countingStore();
    const [a, b, c] = await Promise.all(['aaaa\n', 'bbbb\n', 'cccc\n'].map((t) => store.put(Buffer.from(t))));
    const texts = blobTextSource(store, LIMIT, 10); // two texts of five characters
    for (const ref of [a, b, a, c, a, b]) await texts.read(ref ?? '');
    // a, b read; a kept (read again); c pushes out b, the least recently read; a kept; b read again.
    assert.deepEqual(gets, [a, b, c, b]);
  });
});
