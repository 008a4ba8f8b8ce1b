/**
 * Markdown as the offline model reads it: heading, prose and list blocks of plain text, with code blocks, tables,
 * HTML blocks, front matter and markup dropped. The blocks are marked's (CommonMark with GitHub's extensions),
 * so the model reads as prose what a Markdown renderer shows as prose. No NLP: the scoring in offline-nlp.ts
 * runs on these blocks.
 */
import { Marked } from 'marked';
import type { MarkedToken, Token } from 'marked';

export type BlockKind = 'heading' | 'prose' | 'list';
export interface Block {
  kind: BlockKind;
  text: string;
  /** Character ranges of `text` that were inline code spans. */
  code: Array<[number, number]>;
}

/** A lexer of its own, so a `marked.use()` elsewhere in the process cannot change how documents are read. */
const MARKED = new Marked({ gfm: true, breaks: false, pedantic: false });

/**
 * YAML front matter (Jekyll, Hugo, Docusaurus, GitHub's renderer): `---` on the very first line, up to the next
 * line that is `---` or `...`. Without the closing line it is no front matter, just a thematic break.
 */
const FRONT_MATTER = /^---[ \t]*\n((?:.*\n)*?)(?:---|\.\.\.)[ \t]*(?:\n|$)/;
/** mdBook's preprocessor directives (`{{#include file.rs}}`), which stand for code the reader never sees here. */
const MDBOOK_DIRECTIVE = /\{\{#[^}]*\}\}/g;

const ENTITIES: Record<string, string> = {
  amp: '&',
  lt: '<',
  gt: '>',
  quot: '"',
  apos: "'",
  nbsp: ' ',
  ndash: '–',
  mdash: '—',
  hellip: '…',
  lsquo: '‘',
  rsquo: '’',
  ldquo: '“',
  rdquo: '”',
};

/** What the Markdown holds before lexing: its front matter (raw YAML, if any) and the body after it. */
function split(markdown: string): { frontMatter: string | undefined; body: string } {
  const text = markdown.replace(/^\uFEFF/, '').replace(/\r\n?/g, '\n');
  const match = FRONT_MATTER.exec(text);
  if (match === null) return { frontMatter: undefined, body: text };
  return { frontMatter: match[1] ?? '', body: text.slice(match[0].length) };
}

function lex(body: string): MarkedToken[] {
  return known(MARKED.lexer(body.replace(MDBOOK_DIRECTIVE, '')));
}

/** The tokens marked itself defines (all of them, as no extension is loaded): typed, so the walk is checked. */
function known(tokens: readonly Token[] | undefined): MarkedToken[] {
  return (tokens ?? []).filter(isMarkedToken);
}

const MARKED_TYPES = new Set<string>([
  'blockquote',
  'br',
  'checkbox',
  'code',
  'codespan',
  'def',
  'del',
  'em',
  'escape',
  'heading',
  'hr',
  'html',
  'image',
  'link',
  'list',
  'list_item',
  'paragraph',
  'space',
  'strong',
  'table',
  'text',
]);

function isMarkedToken(token: Token): token is MarkedToken {
  return MARKED_TYPES.has(token.type);
}

/** Splits Markdown into heading, prose and list blocks of plain text, dropping code, tables and markup. */
export function markdownBlocks(markdown: string): Block[] {
  const blocks: Block[] = [];
  const add = (kind: BlockKind, inline: MarkedToken[]): void => {
    const plain = plainText(inline);
    if (/[\p{L}\p{N}]/u.test(plain.text)) blocks.push({ kind, ...plain });
  };
  const walk = (tokens: MarkedToken[], kind: 'prose' | 'list'): void => {
    for (const token of tokens) {
      switch (token.type) {
        case 'heading':
          add('heading', known(token.tokens));
          break;
        case 'paragraph': {
          const inline = known(token.tokens);
          if (!wrappedInHtml(inline)) add(kind, inline);
          break;
        }
        case 'text':
          // A tight list item's text, or text marked found outside a paragraph.
          add(kind, token.tokens === undefined ? [token] : known(token.tokens));
          break;
        case 'blockquote':
          walk(known(token.tokens), kind);
          break;
        case 'list':
          for (const item of token.items) walk(known(item.tokens), 'list');
          break;
        // Code, tables, HTML blocks, link definitions, rules and blank lines are not prose.
        default:
          break;
      }
    }
  };
  walk(lex(split(markdown).body), 'prose');
  return blocks;
}

/**
 * A paragraph that is one HTML element from start to end, such as `<span class="caption">Table 1: Sizes</span>`:
 * a caption, a file name or a badge that labels what is around it, not a sentence of the text.
 */
function wrappedInHtml(inline: MarkedToken[]): boolean {
  const first = inline[0];
  const last = inline.at(-1);
  return inline.length > 1 && first?.type === 'html' && last?.type === 'html' && last.text.startsWith('</');
}

/**
 * The text of inline tokens as a reader sees it: markup, images and inline HTML tags dropped, link text and the
 * content of code spans kept, white space collapsed; with where the code spans are.
 */
function plainText(tokens: MarkedToken[]): { text: string; code: Array<[number, number]> } {
  let text = '';
  const code: Array<[number, number]> = [];
  const append = (part: string): void => {
    const collapsed = part.replace(/\s+/g, ' ');
    text += text === '' || text.endsWith(' ') ? collapsed.replace(/^ /, '') : collapsed;
  };
  const walk = (inline: MarkedToken[]): void => {
    for (const token of inline) {
      switch (token.type) {
        case 'text':
          if (token.tokens !== undefined) walk(known(token.tokens));
          else append(decodeEntities(token.text));
          break;
        case 'escape':
          append(token.text);
          break;
        case 'codespan': {
          const span = token.text.trim().replace(/\s+/g, ' ');
          if (span === '') break;
          if (text !== '' && !text.endsWith(' ') && /^\s/.test(token.raw)) text += ' ';
          code.push([text.length, text.length + span.length]);
          text += span;
          break;
        }
        case 'strong':
        case 'em':
        case 'del':
        case 'link':
          walk(known(token.tokens));
          break;
        case 'br':
          append(' ');
          break;
        // Images, inline HTML tags and task-list checkboxes show no words of the sentence.
        default:
          break;
      }
    }
  };
  walk(tokens);
  const trimmed = text.trimEnd();
  return { text: trimmed, code: code.map(([from, to]) => [from, Math.min(to, trimmed.length)]) };
}

/** Character references in text (marked leaves the named ones as written: a renderer passes them to HTML). */
function decodeEntities(text: string): string {
  return text.replace(
    /&(?:#(\d{1,7})|#[xX]([0-9a-fA-F]{1,6})|([A-Za-z]+));/g,
    (whole, dec?: string, hex?: string, name?: string) => {
      if (name !== undefined) return ENTITIES[name] ?? whole;
      const point = dec !== undefined ? Number(dec) : Number.parseInt(hex ?? '', 16);
      return point > 0 && point <= 0x10ffff ? String.fromCodePoint(point) : whole;
    },
  );
}

/** Where a title search starts: the first 256 bytes, which hold the opening heading of most documents. */
const TITLE_PREFIX = 256;

/**
 * The document's title: `title:` in its YAML front matter, else the text of its first heading (ATX `#` or setext
 * underline, outside code blocks and quotes), else undefined.
 */
export function markdownTitle(markdown: string): string | undefined {
  const { frontMatter, body } = split(markdown);
  const fromFrontMatter = frontMatter === undefined ? undefined : frontMatterTitle(frontMatter);
  if (fromFrontMatter !== undefined) return fromFrontMatter;
  // A client titles every document of a batch: it lexes a growing prefix, cut at a line end, rather than each
  // whole text. Blocks are decided line by line from the top, so the prefix's headings are the whole text's
  // (its last line of text may still be underlined into one: a wider search finds it), but for the link text of
  // a reference whose definition may come later.
  for (let size = TITLE_PREFIX; ; size *= 8) {
    const whole = size >= body.length;
    for (const token of lex(whole ? body : body.slice(0, body.lastIndexOf('\n', size) + 1))) {
      if (token.type !== 'heading') continue;
      if (!whole && token.raw.includes('[')) break;
      const { text } = plainText(known(token.tokens));
      if (text !== '') return text;
    }
    if (whole) return undefined;
  }
}

/**
 * The top-level `title:` of YAML front matter when it is a plain or quoted scalar (`title: Tidal energy`,
 * `title: "Tidal: a primer"`, `title: 'It''s tidal'`); anything else (a block scalar, a list) is no title here.
 * A subset on purpose: the full YAML parser is only a development dependency.
 */
function frontMatterTitle(yaml: string): string | undefined {
  const lines = yaml.split('\n');
  const at = lines.findIndex((line) => /^title[ \t]*:(?:[ \t]|$)/.test(line));
  if (at === -1) return undefined;
  const value = (lines[at] ?? '').replace(/^title[ \t]*:/, '').trim();
  let title: string | undefined;
  if (value.startsWith('"')) {
    const quoted = /^"((?:[^"\\]|\\.)*)"[ \t]*(?:#.*)?$/.exec(value)?.[1];
    title = quoted === undefined ? undefined : unescapeDoubleQuoted(quoted);
  } else if (value.startsWith("'")) {
    title = /^'((?:[^']|'')*)'[ \t]*(?:#.*)?$/.exec(value)?.[1]?.replaceAll("''", "'");
  } else if (!/^[|>[{&*!%@`]/.test(value)) {
    // A plain scalar may go on over more-indented lines, folded into one line.
    const more = lines.slice(at + 1);
    const end = more.findIndex((line) => !/^[ \t]+\S/.test(line));
    const continued = more.slice(0, end === -1 ? more.length : end).map((line) => line.trim());
    // Nothing after `title:` and a list or a mapping below it: not a title of one line.
    if (value === '' && /^(?:-(?:[ \t]|$)|[[{]|[\w-]+[ \t]*:(?:[ \t]|$))/.test(continued[0] ?? ''))
      return undefined;
    title = [value, ...continued]
      .join(' ')
      .replace(/(?:^|[ \t])#.*$/, '')
      .trim();
  }
  title = title?.replace(/\s+/g, ' ').trim();
  return title === '' ? undefined : title;
}

/** A double-quoted YAML scalar's text: JSON's escapes (a subset of YAML's) decoded, else as written. */
function unescapeDoubleQuoted(text: string): string {
  try {
    const decoded: unknown = JSON.parse(`"${text}"`);
    return typeof decoded === 'string' ? decoded : text;
  } catch {
    return text;
  }
}

/** The Markdown as the offline model reads it: plain-text blocks separated by blank lines, code removed. */
export function markdownToPlainText(markdown: string): string {
  return markdownBlocks(markdown)
    .map((block) => block.text)
    .join('\n\n');
}
