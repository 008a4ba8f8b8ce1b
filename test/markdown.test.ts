/**
 * How the offline model reads Markdown (src/model/markdown.ts): the blocks of prose a renderer would show, and
 * nothing a renderer would show as a table, code, an HTML block or front matter; and a document's title.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { markdownBlocks, markdownTitle, markdownToPlainText } from '../src/model/markdown';

/** Each block as `kind: text`, to compare in one assertion. */
function blocksOf(markdown: string): string[] {
  return markdownBlocks(markdown).map((block) => `${block.kind}: ${block.text}`);
}

describe('markdownBlocks', () => {
  it('drops a GFM table without outer pipes, as it drops one with them', () => {
    const markdown = [
      'Tidal sites compared.',
      '',
      'Site | Capacity',
      '--- | ---',
      'Sihwa Lake | 254 MW',
      'La Rance | 240 MW',
      '',
      'Both sit in estuaries.',
    ].join('\n');
    assert.deepEqual(blocksOf(markdown), ['prose: Tidal sites compared.', 'prose: Both sit in estuaries.']);
  });

  it('reads setext headings as headings, of one line or of several', () => {
    const markdown = [
      'Tidal power',
      '===========',
      '',
      'Tides turn turbines.',
      '',
      'The history of',
      'tidal mills',
      '-----------',
      '',
      'Mills ground grain.',
    ].join('\n');
    assert.deepEqual(blocksOf(markdown), [
      'heading: Tidal power',
      'prose: Tides turn turbines.',
      'heading: The history of tidal mills',
      'prose: Mills ground grain.',
    ]);
  });

  it('drops multi-line HTML blocks, their text included, but keeps Markdown between them', () => {
    const markdown = [
      '<div align="center">',
      '  <img src="logo.png" alt="logo">',
      '  Tidal toolkit banner',
      '</div>',
      '',
      'The toolkit models tides.',
      '',
      '<table>',
      '  <tr>',
      '    <td>cell words</td>',
      '  </tr>',
      '</table>',
      '',
      '<details>',
      '<summary>More</summary>',
      '',
      'A paragraph inside the details, written in Markdown.',
      '',
      '</details>',
      '',
      '<span class="caption">Figure 1: A caption that spans',
      'two lines</span>',
      '',
      'Press <kbd>Ctrl</kbd>+<kbd>C</kbd> to stop.',
    ].join('\n');
    assert.deepEqual(blocksOf(markdown), [
      'prose: The toolkit models tides.',
      'prose: A paragraph inside the details, written in Markdown.',
      'prose: Press Ctrl+C to stop.',
    ]);
  });

  it('drops YAML front matter, and reads a document whose first line is a rule as Markdown', () => {
    const withFrontMatter = [
      '---',
      'title: Tidal energy',
      'tags: [energy, ocean]',
      '---',
      '',
      'Tides are predictable.',
    ].join('\n');
    assert.deepEqual(blocksOf(withFrontMatter), ['prose: Tides are predictable.']);
    assert.deepEqual(blocksOf(withFrontMatter.replaceAll('\n', '\r\n')), ['prose: Tides are predictable.']);
    assert.deepEqual(blocksOf('---\n\nNo front matter here: the rule is never closed.'), [
      'prose: No front matter here: the rule is never closed.',
    ]);
  });

  it('keeps a paragraph continued in a quote whole (a line starting "255." is no list there)', () => {
    const markdown = '> A `u8` holds values between 0 and\n> 255. Larger ones overflow.';
    assert.deepEqual(blocksOf(markdown), [
      'prose: A u8 holds values between 0 and 255. Larger ones overflow.',
    ]);
  });

  it('marks inline code spans, list items and emphasis inside a word', () => {
    const [item, prose] = markdownBlocks('- call `read_line` *now*\n\nThe *n*th try &amp; `x  y`.');
    assert.deepEqual(item, { kind: 'list', text: 'call read_line now', code: [[5, 14]] });
    assert.deepEqual(prose, { kind: 'prose', text: 'The nth try & x y.', code: [[14, 17]] });
  });

  it('reads a task list as its items, without the boxes', () => {
    assert.equal(
      markdownToPlainText('- [ ] Check the tides\n- [x] Read the chart'),
      'Check the tides\n\nRead the chart',
    );
  });
});

describe('markdownTitle', () => {
  it("takes front matter's title, plain or quoted, before any heading", () => {
    const title = (line: string) => markdownTitle(`---\n${line}\nlayout: post\n---\n\n# Heading\n`);
    assert.equal(title('title: Tidal energy # a comment'), 'Tidal energy');
    assert.equal(title('title: "Tides: \\"a primer\\""'), 'Tides: "a primer"');
    assert.equal(title("title: 'It''s tidal'"), "It's tidal");
    assert.equal(title('title: Tides over\n  two lines'), 'Tides over two lines');
    assert.equal(title('title:\n  - not\n  - one'), 'Heading');
    assert.equal(title('subtitle: Not the title'), 'Heading');
    assert.equal(markdownTitle('---\ntitle: Open front matter\n\n# Heading'), 'Heading');
  });

  it('takes the first heading, ATX or setext, never a line of a code block', () => {
    assert.equal(markdownTitle('```sh\n# not a title\n```\n\nSetext title\n---\n\n# Later'), 'Setext title');
    assert.equal(markdownTitle('## The *first* `heading` ##\n\n# Second'), 'The first heading');
    assert.equal(markdownTitle('Just prose.\n\n> # quoted, not a title'), undefined);
  });

  it('finds a heading far into the text, and one whose underline comes after the first bytes', () => {
    const prose = 'Tides rise and fall twice a day along most coasts.\n\n'.repeat(100);
    assert.equal(markdownTitle(`${prose}# Far heading\n\nText.`), 'Far heading');
    // The first search reads up to the last line end in the first 256 bytes: here, the underline is after it.
    const lead = 'x'.repeat(230);
    assert.equal(markdownTitle(`${lead}\n\nUnderlined title\n================\n`), 'Underlined title');
    // So is the definition of the heading's link.
    assert.equal(
      markdownTitle(`# The [tide tables][1]\n\n${prose}[1]: https://example.com/tides`),
      'The tide tables',
    );
  });
});
