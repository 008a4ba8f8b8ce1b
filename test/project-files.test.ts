/**
 * What a person editing this repository meets around the code: lint and format cover the project's own files and
 * none of the person's (documents kept in `notes/` for `npm start -- notes/` once failed `npm test`); the watch and
 * server commands exist; "Change a step" in the README names every test that pins what a step returns; every
 * repository path, heading and `npm run` script that the README, docs/ and the code's comments name exists; the
 * README's Layout names every folder; and where docs/ count the stores, they are the stores the code opens.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ESLint } from 'eslint';
import * as prettier from 'prettier';
import ts from 'typescript';
import { z } from 'zod';
import { loadConfig } from '../src/config';
import { openStores } from '../src/store/open';

const ROOT = path.resolve(__dirname, '..');
const PRETTIER_IGNORE = path.join(ROOT, '.prettierignore');

/** Files git tracks, and new ones it does not ignore. */
function projectFiles(): string[] {
  return execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard'], {
    cwd: ROOT,
    encoding: 'utf8',
  })
    .split('\n')
    .filter((f) => f !== '' && fs.existsSync(path.join(ROOT, f)));
}

const Scripts = z.object({ scripts: z.record(z.string(), z.string()) });

describe('lint and format scope', () => {
  const userFiles = [
    'notes/meeting.md',
    'notes/draft.ts',
    'my documents/report.md',
    'inbox/a.json',
    'todo.md',
  ];

  it('Prettier and ESLint leave documents and folders of your own alone', async () => {
    const eslint = new ESLint({ cwd: ROOT });
    for (const file of userFiles) {
      const info = await prettier.getFileInfo(path.join(ROOT, file), { ignorePath: PRETTIER_IGNORE });
      assert.equal(info.ignored, true, `prettier would check ${file}`);
      assert.equal(await eslint.isPathIgnored(path.join(ROOT, file)), true, `eslint would lint ${file}`);
    }
  });

  it("still cover every one of the project's own sources", async () => {
    const eslint = new ESLint({ cwd: ROOT });
    const skipped = /^(samples\/|test\/histories\/|package-lock\.json$)/;
    for (const file of projectFiles()) {
      if (skipped.test(file)) continue;
      const absolute = path.join(ROOT, file);
      if (/\.(ts|md|json|ya?ml|mjs)$/.test(file)) {
        const info = await prettier.getFileInfo(absolute, { ignorePath: PRETTIER_IGNORE });
        assert.equal(
          info.ignored,
          false,
          `${file} is left out of prettier: add its folder to .prettierignore's list`,
        );
      }
      if (file.endsWith('.ts')) {
        assert.equal(
          await eslint.isPathIgnored(absolute),
          false,
          `${file} is left out of eslint: add its folder to the ignores list of eslint.config.mjs`,
        );
      }
    }
  });
});

describe('npm scripts', () => {
  const { scripts } = Scripts.parse(JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')));

  it('worker:watch and start:watch restart the worker and the main job on a change (workflows included)', () => {
    for (const [name, entry] of [
      ['worker:watch', 'src/cli/worker.ts'],
      ['start:watch', 'src/cli/start.ts'],
    ] as const) {
      const script = scripts[name] ?? '';
      assert.match(script, /^tsx watch /, `${name}: ${script}`);
      assert.ok(script.endsWith(` ${entry}`), `${name} does not run ${entry}: ${script}`);
      assert.match(script, /--include '?workflows\//, `${name} does not watch the workflow code: ${script}`);
      assert.ok(fs.existsSync(path.join(ROOT, entry)));
    }
  });

  it('server runs the embedded server in the foreground', () => {
    assert.equal(scripts.server, 'node --import tsx src/cli/server.ts');
    assert.ok(fs.existsSync(path.join(ROOT, 'src/cli/server.ts')));
  });

  it('runs the entry points that drain on a signal under node itself, not under the tsx command', () => {
    // The tsx command relays a signal to its child and SIGKILLs it when the child has not said, within ~60 ms, that
    // it got the signal: a busy worker was killed mid-call by a deploy's SIGTERM to its group.
    for (const name of ['start', 'worker', 'server', 'pipeline', 'publish-target']) {
      assert.match(
        scripts[name] ?? '',
        /^node --import tsx src\/cli\/[a-z-]+\.ts$/,
        `${name}: ${scripts[name]}`,
      );
    }
  });
});

describe('"Change a step" in the README', () => {
  it('names every test that pins what a step returns', () => {
    const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    const section = /^## Change a step\n([\s\S]*?)^## /m.exec(readme)?.[1];
    assert.ok(section !== undefined, 'no "## Change a step" section');
    const testDir = path.join(ROOT, 'test');
    const pinning = fs
      .readdirSync(testDir)
      .filter((f) => f.endsWith('.test.ts'))
      .filter((f) =>
        /\b(tags\.tags|summary\.summary)\b/.test(fs.readFileSync(path.join(testDir, f), 'utf8')),
      );
    assert.ok(pinning.length > 0);
    for (const file of pinning)
      assert.ok(section.includes(`test/${file}`), `the section does not name test/${file}`);
  });
});

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens. */
function anchorOf(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

/** The Markdown pages of the project: the README and the pages of docs/ and bench/ (samples/ and fixtures are documents). */
function markdownPages(): string[] {
  const inFolder = (dir: string) =>
    fs
      .readdirSync(path.join(ROOT, dir))
      .filter((f) => f.endsWith('.md'))
      .map((f) => `${dir}/${f}`);
  return ['README.md', ...inFolder('docs'), ...inFolder('bench')];
}

/** The anchors a Markdown file's headings make (outside code blocks). */
function anchorsIn(markdown: string): Set<string> {
  const withoutCode = markdown.replace(/^```[\s\S]*?^```$/gm, '');
  return new Set([...withoutCode.matchAll(/^#{1,6} (.+)$/gm)].map((m) => anchorOf(m[1] ?? '')));
}

describe('the README and docs/', () => {
  const README_MAX_LINES = 150;

  it(`keep the README a starter's README: at most ${README_MAX_LINES} lines, details in docs/`, () => {
    const lines = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8').trimEnd().split('\n').length;
    assert.ok(
      lines <= README_MAX_LINES,
      `README.md has ${lines} lines: move the new details to a page in docs/ and link it`,
    );
  });

  it('link only to files and headings that exist', () => {
    const dead: string[] = [];
    for (const page of markdownPages()) {
      const text = fs.readFileSync(path.join(ROOT, page), 'utf8').replace(/^```[\s\S]*?^```$/gm, '');
      for (const [, target = ''] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/.test(target)) continue; // http:, mailto:
        const [file = '', anchor] = target.split('#');
        const resolved = file === '' ? path.join(ROOT, page) : path.resolve(ROOT, path.dirname(page), file);
        if (!fs.existsSync(resolved)) {
          dead.push(`${page}: ${target} (no such file)`);
          continue;
        }
        if (anchor !== undefined && resolved.endsWith('.md')) {
          if (!anchorsIn(fs.readFileSync(resolved, 'utf8')).has(anchor))
            dead.push(`${page}: ${target} (no such heading)`);
        }
      }
    }
    assert.deepEqual(dead, []);
  });
});

/**
 * Paths named on purpose although they are not in the repository: each with why. Keep it short; prefer rewording.
 * Files the patches of docs/add-a-step.md create are read from the patches (newFilesOfPatches), not listed here;
 * folders that only exist at run time (data/, .tools/, dist/, node_modules/) are not top-level folders of the
 * repository, so names under them are not checked at all.
 */
const NAMED_BUT_ABSENT: Readonly<Record<string, string>> = {
  'docs/guide.md': "docs/recovery.md's example of a document's path and the ID it becomes (docs:guide.md)",
  'docs/s': 'documents a second, a unit in the benchmark and its tables',
};

/** The files the patches of docs/add-a-step.md create (`--- /dev/null` then `+++ b/<path>`). */
function newFilesOfPatches(): Set<string> {
  const guide = fs.readFileSync(path.join(ROOT, 'docs', 'add-a-step.md'), 'utf8');
  const files = [...guide.matchAll(/^--- \/dev\/null\n\+\+\+ b\/(\S+)$/gm)].map((m) => m[1] ?? '');
  // And the folders they make (`activities/headline/`).
  return new Set([...files, ...files.map((file) => `${path.dirname(file)}/`)]);
}

/** The comments of a TypeScript or JavaScript file, each as its text without the comment markers. */
function commentsOf(file: string, text: string): string[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, false);
  const seen = new Set<number>();
  const comments: string[] = [];
  const take = (ranges: ts.CommentRange[] | undefined) => {
    for (const range of ranges ?? []) {
      if (seen.has(range.pos)) continue;
      seen.add(range.pos);
      comments.push(
        text
          .slice(range.pos, range.end)
          .replace(/^\/\*\*?|\*\/$/g, '')
          .replace(/^\s*(\/\/|\*(?!\/))/gm, ''),
      );
    }
  };
  const visit = (node: ts.Node) => {
    take(ts.getLeadingCommentRanges(text, node.getFullStart()));
    take(ts.getTrailingCommentRanges(text, node.getEnd()));
    for (const child of node.getChildren(source)) visit(child);
  };
  visit(source);
  return comments;
}

/** The comments of a YAML file, a Dockerfile or an ignore file: what follows a `#` at the start or after a space. */
function hashComments(text: string): string[] {
  return [...text.matchAll(/(?:^|\s)#(.*)$/gm)].map((m) => m[1] ?? '');
}

/** What each file of the project says in prose: a Markdown page whole, the comments of code and configuration. */
function proseOfProject(): { file: string; text: string }[] {
  const read = (file: string) => fs.readFileSync(path.join(ROOT, file), 'utf8');
  const prose = markdownPages().map((file) => ({ file, text: read(file) }));
  for (const file of projectFiles()) {
    if (
      /^(src|activities|workflows|scripts|bench|test)\/.*\.(ts|mjs|js)$/.test(file) ||
      file === 'eslint.config.mjs'
    )
      prose.push({ file, text: commentsOf(file, read(file)).join('\n') });
    else if (/^(deploy\/.*\.ya?ml|docker-compose\.yml|Dockerfile|\.prettierignore)$/.test(file))
      prose.push({ file, text: hashComments(read(file)).join('\n') });
  }
  return prose;
}

/** The repository's top-level folders (of tracked files): a name that starts with one is a repository path. */
function topLevelFolders(): string[] {
  const folders = projectFiles()
    .filter((f) => f.includes('/') && !f.startsWith('.'))
    .map((f) => f.slice(0, f.indexOf('/')));
  return [...new Set(folders)];
}

/**
 * The repository paths a text names: a top-level folder, a slash and more (`src/config.ts`, `test/`,
 * `docs/deploy.md#the-lookup-by-key`), not inside a longer path or a URL; with its `#anchor` or `:line` when it has
 * one. A name cut at a placeholder or a glob (`activities/<step>/`, `test/*.test.ts`) is checked up to there; one
 * followed by ` at <commit>` names the file as it was then, and is not checked.
 */
function pathsNamed(
  text: string,
  folders: readonly string[],
): { name: string; anchor?: string; line?: number }[] {
  const pattern = new RegExp(
    String.raw`(?<![\w./@~$-])((?:${folders.join('|')})\/[\w./-]*)(?:#([\p{L}\p{N}_-]+)|:(\d+))?`,
    'gu',
  );
  const atCommit = / at [0-9a-f]{7,40}\b/y;
  const named = [...text.matchAll(pattern)].filter((m) => {
    atCommit.lastIndex = m.index + m[0].length;
    return !atCommit.test(text);
  });
  return named.map((m) => {
    const name = (m[1] ?? '').replace(/\.+$/, '');
    return {
      name,
      ...(m[2] !== undefined ? { anchor: m[2] } : {}),
      ...(m[3] !== undefined ? { line: Number(m[3]) } : {}),
    };
  });
}

/** The npm scripts a text runs: `npm run <script>`, `npm start`, `npm test`. */
function scriptsNamed(text: string): string[] {
  return [...text.matchAll(/\bnpm (?:run\s+([a-z][\w:.-]*)|(start|test)\b)/g)].map((m) =>
    (m[1] ?? m[2] ?? '').replace(/[.:]+$/, ''),
  );
}

describe('names in the README, docs/ and comments', () => {
  const { scripts } = Scripts.parse(JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')));
  const prose = proseOfProject();

  it('name repository paths that exist, headings that exist and lines within their file', () => {
    const folders = topLevelFolders();
    const created = newFilesOfPatches();
    const exists = (name: string) =>
      [name, `${name}.ts`, `${name}/index.ts`].some((candidate) => fs.existsSync(path.join(ROOT, candidate)));
    const missing = new Set<string>();
    for (const { file, text } of prose) {
      for (const { name, anchor, line } of pathsNamed(text, folders)) {
        if (created.has(name) || NAMED_BUT_ABSENT[name] !== undefined) continue;
        if (!exists(name)) {
          missing.add(`${file}: ${name} (no such file or folder)`);
          continue;
        }
        const absolute = path.join(ROOT, name);
        if (anchor !== undefined && name.endsWith('.md')) {
          if (!anchorsIn(fs.readFileSync(absolute, 'utf8')).has(anchor))
            missing.add(`${file}: ${name}#${anchor} (no such heading)`);
        }
        if (line !== undefined && fs.statSync(absolute).isFile()) {
          if (line > fs.readFileSync(absolute, 'utf8').split('\n').length)
            missing.add(`${file}: ${name}:${line} (past its last line)`);
        }
      }
    }
    assert.deepEqual(
      [...missing],
      [],
      'rename the path where it is named, or add it to NAMED_BUT_ABSENT with why',
    );
  });

  it('run npm scripts that package.json has', () => {
    const missing = new Set<string>();
    for (const { file, text } of prose) {
      for (const name of scriptsNamed(text))
        if (scripts[name] === undefined) missing.add(`${file}: npm run ${name} (no such script)`);
    }
    assert.deepEqual([...missing], []);
  });

  it('the check itself finds a path, a heading and a script that are not there', () => {
    const text =
      'see src/no-such-file.ts, docs/deploy.md#no-such-heading and `npm run no-such-script`; not ../src/x.ts';
    assert.deepEqual(
      pathsNamed(text, topLevelFolders()).map((p) => p.name),
      ['src/no-such-file.ts', 'docs/deploy.md'],
    );
    assert.equal(pathsNamed(text, topLevelFolders())[1]?.anchor, 'no-such-heading');
    assert.deepEqual(scriptsNamed(text), ['no-such-script']);
  });
});

/** The README's "## Layout" section: the text of its code blocks. */
function layoutBlockOf(readme: string): string {
  const section = /^## Layout\n([\s\S]*?)^## /m.exec(readme)?.[1];
  assert.ok(section !== undefined, 'the README has no "## Layout" section');
  return [...section.matchAll(/^```\n([\s\S]*?)^```$/gm)].map((m) => m[1] ?? '').join('\n');
}

/**
 * What is wrong with a README's Layout block, given the files git tracks: a top-level folder or a folder directly
 * under src/ it does not name (as `docs/`, `src/steps/`), and a path it names (a word with a slash) that is not there.
 */
function layoutProblems(
  readme: string,
  tracked: readonly string[],
  exists: (name: string) => boolean,
): string[] {
  const block = layoutBlockOf(readme);
  const named = new Set(
    [...block.matchAll(/(?<![\w./-])((?:\.?[\w-]+\/)+[\w.-]*)/g)].map((m) => (m[1] ?? '').replace(/\.$/, '')),
  );
  const folders = new Set<string>();
  for (const file of tracked) {
    const parts = file.split('/');
    if (parts.length > 1) folders.add(`${parts[0]}/`);
    if (parts[0] === 'src' && parts.length > 2) folders.add(`src/${parts[1]}/`);
  }
  const problems = [...folders]
    .filter((folder) => !named.has(folder))
    .map((folder) => `${folder} is not in the Layout block: add a line for it`);
  for (const name of named)
    if (!exists(name))
      problems.push(`${name} is named in the Layout block, and there is no such file or folder`);
  return problems;
}

describe("the README's Layout", () => {
  const tracked = execFileSync('git', ['ls-files'], { cwd: ROOT, encoding: 'utf8' })
    .split('\n')
    .filter((f) => f !== '' && fs.existsSync(path.join(ROOT, f)));
  const exists = (name: string) => fs.existsSync(path.join(ROOT, name));

  it('names every top-level folder and every folder of src/, and only paths that exist', () => {
    const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    assert.deepEqual(layoutProblems(readme, tracked, exists), []);
  });

  it('the check itself finds a folder left out and a path that is not there', () => {
    const readme = '## Layout\n\n```\nsrc/model/   models\nsrc/gone.ts  gone\n```\n\n## More\n';
    const files = ['src/model/types.ts', 'src/steps/define.ts', 'docs/cost.md'];
    assert.deepEqual(
      layoutProblems(readme, files, (name) => name === 'src/model/'),
      [
        'src/ is not in the Layout block: add a line for it',
        'src/steps/ is not in the Layout block: add a line for it',
        'docs/ is not in the Layout block: add a line for it',
        'src/gone.ts is named in the Layout block, and there is no such file or folder',
      ],
    );
  });
});

/** The members of `Stores` (src/store/open.ts) that are not stores. */
const NOT_STORES = new Set(['backend', 'close']);

/**
 * How docs/ names each store of `Stores`: a sentence of docs/ that counts the stores ("six stores") names every one
 * with these words. A new store goes here and into those sentences.
 */
const STORE_WORDS: Readonly<Record<string, string>> = {
  blobs: 'document texts',
  memo: 'memo',
  ledger: 'delivery ledger',
  rateLimits: 'pacing',
  bulkClaims: 'claims',
  checkpoints: 'checkpoints',
  publications: 'publication',
};

const COUNT_WORDS = [
  'two',
  'three',
  'four',
  'five',
  'six',
  'seven',
  'eight',
  'nine',
  'ten',
  'eleven',
  'twelve',
];

/** The sentences of a page that count the stores in words, each with the count. */
function storeCounts(markdown: string): { count: number; sentence: string }[] {
  const pattern = new RegExp(String.raw`\b(${COUNT_WORDS.join('|')}) stores\b[\s\S]*?(?:\.(?=\s|$)|$)`, 'gi');
  return [...markdown.matchAll(pattern)].map((m) => ({
    count: COUNT_WORDS.indexOf((m[1] ?? '').toLowerCase()) + 2,
    sentence: m[0].replace(/\s+/g, ' '),
  }));
}

describe('the stores docs/ count', () => {
  it('are the stores openStores opens', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'stores-named-'));
    try {
      const stores = await openStores(loadConfig({ DATA_DIR: dir }));
      await stores.close();
      assert.deepEqual(
        Object.keys(stores)
          .filter((key) => !NOT_STORES.has(key))
          .sort(),
        Object.keys(STORE_WORDS).sort(),
        'Stores (src/store/open.ts) and STORE_WORDS differ: say here how docs/ names the new store, and name it ' +
          'where docs/backends.md, docs/deploy.md and docs/security.md count the stores',
      );
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('each sentence that counts them gives their number and names every one', () => {
    const problems: string[] = [];
    const counted = new Set<string>();
    for (const page of markdownPages()) {
      for (const { count, sentence } of storeCounts(fs.readFileSync(path.join(ROOT, page), 'utf8'))) {
        counted.add(page);
        const stores = Object.keys(STORE_WORDS).length;
        if (count !== stores)
          problems.push(`${page}: counts ${count} stores, there are ${stores}: "${sentence}"`);
        for (const [store, words] of Object.entries(STORE_WORDS))
          if (!sentence.toLowerCase().includes(words))
            problems.push(`${page}: does not name ${store} ("${words}") in "${sentence}"`);
      }
    }
    for (const page of ['docs/backends.md', 'docs/deploy.md', 'docs/security.md'])
      if (!counted.has(page)) problems.push(`${page}: no sentence counts the stores ("six stores: ...")`);
    assert.deepEqual(problems, []);
  });
});
