import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { markdownToPlainText } from '../src/model/markdown';
import { countTokens } from '../src/model/offline-nlp';
import { extractiveSummary } from '../activities/summarize/offline';
import { keywordTags } from '../activities/tag/offline';

import { SAMPLES_DIR } from '../src/config';
/**
 * Seven chapters of the Rust book, committed with their licenses (test/fixtures/corpus/README.md): the corpus
 * checks run on every clone, and fail rather than skip if these files go missing.
 */
const COMMITTED_CHAPTERS = path.join(__dirname, 'fixtures', 'corpus', 'rust-book');
/** The whole book (110 chapters), when the shared corpus is checked out beside the project. */
const WHOLE_BOOK = path.join(__dirname, '..', '..', 'shared', 'corpus', 'rust-book');
const SAMPLE_NAMES = ['durable-execution', 'sourdough-starter', 'tidal-energy', 'incident-postmortem'];

function sample(name: string): string {
  return readFileSync(path.join(SAMPLES_DIR, `${name}.md`), 'utf8');
}

/** Naive splitter, good enough for the plain prose of the samples and the fixtures below. */
function sentencesOf(plain: string): string[] {
  return plain.split(/\n\n/).flatMap((paragraph) => paragraph.split(/(?<=[.!?])\s+(?=[A-Z])/));
}

/**
 * Indices of the source sentences that the summary is made of, in order; fails the test unless the summary is
 * exactly those sentences, verbatim, joined by single spaces, in source order.
 */
function sentenceIndices(summary: string, sentences: string[]): number[] {
  const indices: number[] = [];
  let rest = summary;
  let next = 0;
  while (rest.length > 0) {
    const found = sentences.findIndex(
      (sentence, index) =>
        index >= next &&
        rest.startsWith(sentence) &&
        (rest.length === sentence.length || rest[sentence.length] === ' '),
    );
    assert.notEqual(found, -1, `not a source sentence (or out of order): "${rest.slice(0, 120)}"`);
    indices.push(found);
    rest = rest.slice((sentences[found] ?? '').length).trimStart();
    next = found + 1;
  }
  return indices;
}

const PLAIN_SENTENCES = [
  'Lighthouses guided ships along dangerous coasts for centuries.',
  'A lighthouse keeper trimmed the lamp wick every evening.',
  'The keeper also wound the clockwork that turned the lens.',
  'Fog made the light useless, so many lighthouses added a fog horn.',
  'Automation replaced most lighthouse keepers in the twentieth century.',
  'Today a lighthouse lamp is usually an electric bulb controlled by a timer.',
  'Some old lighthouses are now museums that visitors can climb.',
  'My aunt once painted a picture of a red boat.',
];
const PLAIN_TEXT = PLAIN_SENTENCES.join(' ');

// Minimal English stop words that must never be tags.
const STOP_WORDS = new Set(
  'a an and are as at be but by for from has have he her his i if in into is it its of on or our she so than that the their them then there these they this to was we were what when which who will with you your'.split(
    ' ',
  ),
);

describe('extractiveSummary', () => {
  it('returns verbatim source sentences in source order', () => {
    for (const maxSentences of [1, 2, 3, 5]) {
      const summary = extractiveSummary(PLAIN_TEXT, maxSentences);
      const indices = sentenceIndices(summary, PLAIN_SENTENCES);
      assert.equal(indices.length, maxSentences);
    }
    for (const name of SAMPLE_NAMES) {
      const summary = extractiveSummary(sample(name), 3);
      const indices = sentenceIndices(summary, sentencesOf(markdownToPlainText(sample(name))));
      assert.equal(indices.length, 3, name);
    }
  });

  it('respects maxSentences and returns every sentence of a short text', () => {
    assert.equal(sentenceIndices(extractiveSummary(PLAIN_TEXT, 1), PLAIN_SENTENCES).length, 1);
    const short = PLAIN_SENTENCES.slice(0, 2).join(' ');
    assert.equal(extractiveSummary(short, 5), short);
    for (const name of SAMPLE_NAMES) {
      const plainSentences = sentencesOf(markdownToPlainText(sample(name)));
      for (const max of [1, 2, 4]) {
        assert.equal(sentenceIndices(extractiveSummary(sample(name), max), plainSentences).length, max);
      }
    }
  });

  it('prefers sentences carrying the main topic', () => {
    const summary = extractiveSummary(PLAIN_TEXT, 2);
    assert.ok(!summary.includes('red boat'), summary);
    assert.match(summary, /lighthouse/i);
  });

  it('never includes code, comments, include directives or headings', () => {
    const markdown = [
      '# Zebra Crossing Rules For Pedestrians',
      '',
      'A zebra crossing gives pedestrians priority over traffic. Drivers must stop when a pedestrian waits.',
      '',
      '```js',
      'const zebra = "zebra zebra zebra crossing pedestrian qwertycode";',
      'console.log(zebra); // Pedestrians cross the zebra crossing here.',
      '```',
      '',
      '    indentedcode zebra crossing pedestrian.',
      '',
      '<!-- commentword zebra crossing pedestrian. -->',
      '{{#include ../listings/zebra/crossing.rs}}',
      '',
      'The stripes make the crossing visible to drivers at night. A zebra crossing has flashing beacons.',
      '',
      '| zebra | tablecell crossing pedestrian. |',
      '| ----- | ----- |',
      '| zebra | tablecell |',
    ].join('\n');
    for (const max of [1, 3, 10]) {
      const summary = extractiveSummary(markdown, max);
      for (const forbidden of [
        'qwertycode',
        'console',
        'indentedcode',
        'commentword',
        'include',
        'tablecell',
        '```',
      ]) {
        assert.ok(!summary.includes(forbidden), `"${forbidden}" leaked into: ${summary}`);
      }
      assert.ok(!summary.includes('Rules For Pedestrians'), `heading chosen: ${summary}`);
    }
    assert.equal(extractiveSummary(markdown, 10).length > 0, true);
    for (const tag of keywordTags(markdown, 10)) {
      assert.ok(!/qwertycode|indentedcode|commentword|tablecell|console/.test(tag), tag);
    }
  });

  it('strips Markdown markup but keeps the text', () => {
    const plain = markdownToPlainText(
      [
        '## A *Small* Heading ##',
        '',
        'Read the [style guide](https://example.com/guide "Guide") and **never** skip _tests_.',
        '![diagram](img/diagram.png) Use `snake_case_names` in `ini` files.',
        '',
        '- first bullet item',
        '2. numbered item',
        '> quoted ~~old~~ text',
      ].join('\n'),
    );
    assert.equal(
      plain,
      [
        'A Small Heading',
        'Read the style guide and never skip tests. Use snake_case_names in ini files.',
        'first bullet item',
        'numbered item',
        'quoted old text',
      ].join('\n\n'),
    );
  });

  it('caps a very long sentence at a word boundary with an ellipsis', () => {
    const long = `The ${'very '.repeat(150)}long sentence ends here.`;
    const summary = extractiveSummary(long, 1);
    assert.ok(summary.endsWith('…'), summary);
    assert.ok(summary.length <= 401, String(summary.length));
    assert.ok(long.startsWith(summary.slice(0, -1)));
    assert.ok(!summary.slice(0, -1).endsWith(' '));
  });

  it('returns an empty summary when nothing is left after cleaning', () => {
    assert.equal(extractiveSummary('', 3), '');
    assert.equal(extractiveSummary('   \n\n  ', 3), '');
    assert.equal(extractiveSummary('```\nonly code here.\n```\n<!-- and a comment. -->', 3), '');
  });

  it('is deterministic', () => {
    for (const name of SAMPLE_NAMES) {
      const first = extractiveSummary(sample(name), 3);
      extractiveSummary(PLAIN_TEXT, 2);
      assert.equal(extractiveSummary(sample(name), 3), first);
    }
  });
});

describe('keywordTags', () => {
  it('returns words, never what a lookup on an object finds for a name like constructor', () => {
    // A 10,000-document run hit this: a lemma looked up in a plain object found Object.prototype.constructor,
    // and the tag (a function) was stored as null, so the step failed for good on that document.
    const text = [
      '# The constructor',
      '',
      'Each constructor builds an instance. The constructor takes a prototype and a constructor argument.',
      'A constructor may call another constructor; the constructor of a struct is a plain function.',
    ].join('\n');
    const tags = keywordTags(text, 5);
    assert.ok(tags.length > 0);
    for (const tag of tags) assert.equal(typeof tag, 'string', JSON.stringify(tags.map(String)));
    assert.ok(tags.includes('constructor'), JSON.stringify(tags));
  });

  it('finds the topic of each sample', () => {
    const expected: Record<string, string[]> = {
      'sourdough-starter': ['starter', 'flour'],
      'tidal-energy': ['tidal energy', 'turbine', 'tide'],
      'durable-execution': ['checkpoint', 'idempotency key'],
      'incident-postmortem': ['pool', 'connection'],
    };
    for (const [name, anyOf] of Object.entries(expected)) {
      const tags = keywordTags(sample(name), 5);
      const words = tags.flatMap((tag) => [tag, ...tag.split(' ')]);
      assert.ok(
        anyOf.some((word) => words.includes(word)),
        `${name}: ${tags.join(', ')}`,
      );
    }
    assert.ok(keywordTags(sample('sourdough-starter'), 3).includes('starter'));
  });

  it('returns at most maxTags short lowercase content words, no stop words or numbers', () => {
    for (const name of SAMPLE_NAMES) {
      for (const max of [1, 5, 12]) {
        const tags = keywordTags(sample(name), max);
        assert.ok(tags.length >= 1 && tags.length <= max, `${name}: ${tags.length}`);
        assert.equal(new Set(tags).size, tags.length);
        for (const tag of tags) {
          assert.match(tag, /^[a-z][a-z'’-]*[a-z]( [a-z][a-z'’-]*[a-z])?$/, tag);
          for (const word of tag.split(' ')) {
            assert.ok(word.length >= 3, tag);
            assert.ok(!STOP_WORDS.has(word), `stop word in ${name}: ${tag}`);
          }
        }
      }
    }
  });

  it('does not list a phrase together with one of its own words', () => {
    for (const name of SAMPLE_NAMES) {
      const tags = keywordTags(sample(name), 12);
      const words = tags.flatMap((tag) => tag.split(' '));
      assert.equal(new Set(words).size, words.length, tags.join(', '));
    }
  });

  it('boosts words from headings and ranks ties alphabetically', () => {
    const text = '# Kestrels\n\nBirds hunt mice. Owls hunt voles. Kestrels hover.';
    assert.equal(keywordTags(text, 1)[0], 'kestrel');
    assert.deepEqual(keywordTags('Apples and pears.', 2), ['apple', 'pear']);
    assert.deepEqual(keywordTags('Pears and apples.', 2), ['apple', 'pear']);
  });

  it('is deterministic and empty for empty input', () => {
    for (const name of SAMPLE_NAMES) {
      const first = keywordTags(sample(name), 5);
      keywordTags(PLAIN_TEXT, 5);
      assert.deepEqual(keywordTags(sample(name), 5), first);
    }
    assert.deepEqual(keywordTags('', 5), []);
  });
});

describe('countTokens', () => {
  it('counts words and punctuation, not whitespace', () => {
    assert.equal(countTokens(''), 0);
    assert.equal(countTokens('Hello, world!'), 4);
    assert.equal(countTokens('Hello,\n\n   world!'), 4);
    const text = sample('tidal-energy');
    assert.equal(countTokens(text), countTokens(text));
    assert.ok(countTokens(text) > text.split(/\s+/).length / 2);
  });
});

/** The corpus checks on the chapters in `dir`, which must hold at least `minChapters` of them. */
function corpusChecks(dir: string, minChapters: number): void {
  const chapters = (): string[] => {
    const files = readdirSync(dir)
      .filter((file) => file.endsWith('.md'))
      .sort();
    assert.ok(files.length >= minChapters, `only ${files.length} chapters in ${dir}`);
    return files;
  };

  it('summarises and tags every chapter', (t) => {
    const files = chapters();
    const started = performance.now();
    let bytes = 0;
    for (const file of files) {
      const text = readFileSync(path.join(dir, file), 'utf8');
      bytes += text.length;
      const summary = extractiveSummary(text, 3);
      const tags = keywordTags(text, 5);
      countTokens(text);
      assert.ok(summary.length > 0, `${file}: empty summary`);
      assert.ok(!summary.includes('```') && !summary.includes('{{#'), `${file}: markup in summary`);
      assert.ok(tags.length >= 1, `${file}: no tags`);
    }
    const elapsed = performance.now() - started;
    t.diagnostic(
      `processed ${files.length} chapters (${(bytes / 1024).toFixed(0)} KiB) in ${elapsed.toFixed(0)} ms`,
    );
  });

  it('tags the chapters by their subject', () => {
    const expectations: Array<[string, string]> = [
      ['ch09-00-error-handling.md', 'error'],
      ['ch04-01-what-is-ownership.md', 'ownership'],
      ['ch16-01-threads.md', 'thread'],
      ['ch08-03-hash-maps.md', 'hash'],
      ['ch10-03-lifetime-syntax.md', 'lifetime'],
    ];
    for (const [file, word] of expectations) {
      const tags = keywordTags(readFileSync(path.join(dir, file), 'utf8'), 5);
      assert.ok(
        tags.some((tag) => tag.split(' ').includes(word)),
        `${file}: expected "${word}" in ${tags.join(', ')}`,
      );
    }
  });

  it('handles the largest chapter well under a second', () => {
    const sizes = chapters().map((file) => ({ file, size: statSync(path.join(dir, file)).size }));
    const largest = sizes.reduce((a, b) => (b.size > a.size ? b : a));
    const text = readFileSync(path.join(dir, largest.file), 'utf8');
    extractiveSummary('Warm up the model.', 1);
    const started = performance.now();
    extractiveSummary(text, 3);
    keywordTags(`${text}\n`, 5);
    countTokens(text);
    assert.ok(performance.now() - started < 1000);
  });
}

describe('rust-book corpus: the committed chapters', () => {
  it('is committed with both of its licenses', () => {
    for (const license of ['LICENSE-MIT', 'LICENSE-APACHE']) {
      assert.ok(existsSync(path.join(COMMITTED_CHAPTERS, license)), `${license} is missing`);
    }
  });

  corpusChecks(COMMITTED_CHAPTERS, 7);
});

describe(
  'rust-book corpus: the whole book',
  {
    skip:
      !existsSync(WHOLE_BOOK) && `not found at ${WHOLE_BOOK}; the same checks ran on the committed chapters`,
  },
  () => corpusChecks(WHOLE_BOOK, 100),
);
