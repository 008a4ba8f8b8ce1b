/**
 * Markdown as the offline model reads it: heading, prose and list blocks of plain text, with code blocks, tables
 * and markup dropped. Pure string work, no NLP: the scoring in offline-nlp.ts runs on these blocks.
 */

export type BlockKind = 'heading' | 'prose' | 'list';
export interface Block {
  kind: BlockKind;
  text: string;
  /** Character ranges of `text` that were inline code spans. */
  code: Array<[number, number]>;
}

const FENCE = /^\s*(`{3,}|~{3,})/;
const ATX_HEADING = /^\s{0,3}#{1,6}(?:\s+(.*?))?\s*#*\s*$/;
const SETEXT_UNDERLINE = /^\s{0,3}(?:=+|-+)\s*$/;
const THEMATIC_BREAK = /^\s{0,3}(?:(?:\*\s*){3,}|(?:-\s*){3,}|(?:_\s*){3,})$/;
const LIST_ITEM = /^(\s*)(?:[-*+]|\d{1,9}[.)])\s+/;
const TABLE_SEPARATOR = /^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)+\|?\s*$/;
const LINK_DEFINITION = /^\s{0,3}\[[^\]]+\]:\s*\S+/;
const WHOLE_LINE_HTML = /^\s*<\/?[A-Za-z][^>]*>.*(?:<\/[A-Za-z][^>]*>|>)\s*$/;
const INDENTED = /^(?: {4}|\t)/;

/** Splits Markdown into heading, prose and list blocks of plain text, dropping code, tables and markup. */
export function markdownBlocks(markdown: string): Block[] {
  const text = markdown
    .replace(/\r\n?/g, '\n')
    .replace(/<!--[\s\S]*?(?:-->|$)/g, '')
    .replace(/<pre\b[\s\S]*?(?:<\/pre>|$)/gi, '')
    .replace(/\{\{#[^}]*\}\}/g, '');
  const blocks: Block[] = [];
  let current: { kind: BlockKind; lines: string[]; quoted: boolean } | undefined;
  let fence: { char: string; length: number } | undefined;
  let inIndentedCode = false;
  let inList = false;
  let afterBlank = true;

  const flush = (): void => {
    if (current !== undefined) {
      const cleaned = cleanInline(current.lines.join(' '));
      if (/[\p{L}\p{N}]/u.test(cleaned.text)) blocks.push({ kind: current.kind, ...cleaned });
    }
    current = undefined;
  };

  for (const rawLine of text.split('\n')) {
    // Block quotes are read as their content, so fences and lists inside them are handled like any other.
    const line = rawLine.replace(/^\s*(?:>\s?)+/, '');
    const quoted = line.length !== rawLine.length;
    if (fence !== undefined) {
      const marker = FENCE.exec(line)?.[1];
      if (marker !== undefined && marker[0] === fence.char && marker.length >= fence.length) {
        if (line.trim() === marker) fence = undefined;
      }
      continue;
    }
    const open = FENCE.exec(line)?.[1];
    if (open !== undefined) {
      flush();
      fence = { char: open[0] ?? '`', length: open.length };
      continue;
    }
    if (line.trim() === '') {
      flush();
      afterBlank = true;
      continue;
    }
    if (INDENTED.test(line) && (inIndentedCode || (afterBlank && !inList && current === undefined))) {
      inIndentedCode = true;
      continue;
    }
    inIndentedCode = false;
    if (current !== undefined && current.quoted !== quoted) flush();
    const wasAfterBlank = afterBlank;
    afterBlank = false;

    if (current !== undefined && current.kind === 'prose' && current.lines.length === 1) {
      if (SETEXT_UNDERLINE.test(line)) {
        current.kind = 'heading';
        flush();
        continue;
      }
    }
    if (THEMATIC_BREAK.test(line) || LINK_DEFINITION.test(line) || WHOLE_LINE_HTML.test(line)) {
      flush();
      continue;
    }
    if (TABLE_SEPARATOR.test(line) && line.includes('|')) {
      // The line before a separator is the table's header row.
      if (current !== undefined && (current.lines.at(-1) ?? '').includes('|')) current.lines.pop();
      flush();
      continue;
    }
    if (/^\s*\|/.test(line)) {
      flush();
      continue;
    }
    const heading = ATX_HEADING.exec(line);
    if (heading !== null) {
      flush();
      current = { kind: 'heading', lines: [heading[1] ?? ''], quoted };
      flush();
      inList = false;
      continue;
    }
    const bullet = LIST_ITEM.exec(line);
    if (bullet !== null) {
      flush();
      current = { kind: 'list', lines: [line.slice(bullet[0].length)], quoted };
      inList = true;
      continue;
    }
    if (current === undefined) {
      // After a blank line, an indented paragraph continues a list item; an unindented one ends the list.
      if (wasAfterBlank && !/^\s/.test(line)) inList = false;
      current = { kind: inList ? 'list' : 'prose', lines: [], quoted };
    }
    current.lines.push(line.trim());
  }
  flush();
  return blocks;
}

const ENTITIES: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'", nbsp: ' ' };

/** Removes inline Markdown and HTML markup, keeping link text and the content of code spans (without backticks). */
function cleanInline(text: string): { text: string; code: Array<[number, number]> } {
  const codeSpans: string[] = [];
  // Code spans are set aside first so their underscores and brackets are not mistaken for markup.
  let out = text.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_match, _ticks: string, code: string) => {
    codeSpans.push(code.trim().replace(/\s+/g, ' '));
    return `\uE000${codeSpans.length - 1}\uE001`;
  });
  out = out
    .replace(/!\[[^\]]*\](?:\((?:[^()]|\([^()]*\))*\)|\[[^\]]*\])?/g, '')
    .replace(/\[([^\]]+)\]\((?:[^()]|\([^()]*\))*\)/g, '$1')
    .replace(/\[([^\]]+)\]\[[^\]]*\]/g, '$1')
    .replace(/\[([^\]]+)\](?![[(:])/g, '$1')
    .replace(/<((?:https?|mailto):[^>\s]+)>/g, '$1')
    .replace(/<\/?[A-Za-z][^>]*>/g, '')
    .replace(/&(amp|lt|gt|quot|apos|nbsp);/g, (_match, name: string) => ENTITIES[name] ?? '')
    .replace(/&#(\d+);/g, (_match, code: string) => String.fromCodePoint(Number(code)))
    .replace(/(\*\*|__)(?=\S)([\s\S]*?\S)\1/g, '$2')
    .replace(/(^|[^\p{L}\p{N}*\\])\*(?=\S)([\s\S]*?\S)\*(?![\p{L}\p{N}])/gu, '$1$2')
    .replace(/(^|[^\p{L}\p{N}_\\])_(?=\S)([\s\S]*?\S)_(?![\p{L}\p{N}])/gu, '$1$2')
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, '$1')
    .replace(/\\([\\`*_{}[\]()#+\-.!|<>~])/g, '$1')
    .replace(/\s+/g, ' ')
    .trim();
  let plain = '';
  const code: Array<[number, number]> = [];
  let last = 0;
  for (const match of out.matchAll(/\uE000(\d+)\uE001/g)) {
    plain += out.slice(last, match.index);
    const span = codeSpans[Number(match[1])] ?? '';
    code.push([plain.length, plain.length + span.length]);
    plain += span;
    last = match.index + match[0].length;
  }
  return { text: plain + out.slice(last), code };
}

/** The Markdown as the offline model reads it: plain-text blocks separated by blank lines, code removed. */
export function markdownToPlainText(markdown: string): string {
  return markdownBlocks(markdown)
    .map((block) => block.text)
    .join('\n\n');
}
