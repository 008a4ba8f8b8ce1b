/**
 * The embedded offline model's reading of a text: its sentences and their words (lemmas, parts of speech) from the
 * plain-text blocks of markdown.ts, computed with wink-nlp, on which each step's offline answer works
 * (activities/<step>/offline.ts).
 * Everything here is pure and deterministic; the wink model is loaded on first use, not on import.
 */
import winkNLP from 'wink-nlp';
import type { ItemSentence, ItemToken, WinkMethods } from 'wink-nlp';
import model from 'wink-eng-lite-web-model';
import { markdownBlocks } from './markdown';
import type { BlockKind } from './markdown';
import type { ModelAnswer, OfflineStep } from './types';

let cachedNlp: WinkMethods | undefined;

/** The wink pipeline, built on first use: instantiating it over the model costs ~200 ms. */
function nlp(): WinkMethods {
  // Only sentence boundaries and parts of speech are needed; NER, sentiment and negation would cost time.
  cachedNlp ??= winkNLP(model, ['sbd', 'pos']);
  return cachedNlp;
}

/** How much more a heading's words count than a sentence's. */
export const HEADING_WEIGHT = 3;

export interface Token {
  lemma: string;
  pos: string;
  isWord: boolean;
  isStop: boolean;
  /** Inside an inline code span: an identifier, not a word of the prose. */
  inCode: boolean;
}

export interface Sentence {
  kind: BlockKind;
  /** Verbatim text of the sentence within its cleaned block. */
  text: string;
  tokens: Token[];
  /** Belongs to the first prose paragraph, which usually introduces the subject. */
  lead: boolean;
}

/**
 * wink's typings declare `its.lemma` with a parameter list that `out()` does not accept, although it works at
 * run time; this view of a token's `out` accepts it, and an ItemToken satisfies it structurally.
 */
interface LemmaOut {
  out(itsf: WinkMethods['its']['lemma']): string | undefined;
}

function lemmaOf(token: LemmaOut, its: WinkMethods['its']): string | undefined {
  return token.out(its.lemma);
}

/** A recent text, with what has been read of it so far. */
interface RecentText {
  text: string;
  sentences?: Sentence[];
  tokens?: number;
}

/**
 * What the last few texts cost to read, newest last: their analyses and their token counts. Summary and tags of a
 * document share both (a count of a chapter's tokens alone is ~5 ms), and with many documents in flight a
 * document's two requests need not come one right after the other.
 */
const recentTexts: RecentText[] = [];
const TEXTS_KEPT = 4;

/** The entry of `text` among the recent ones, made the newest (a new, empty one if it is not among them). */
function recentEntry(text: string): RecentText {
  const kept = recentTexts.findIndex((entry) => entry.text === text);
  const entry = kept === -1 ? { text } : (recentTexts.splice(kept, 1)[0] ?? { text });
  recentTexts.push(entry);
  if (recentTexts.length > TEXTS_KEPT) recentTexts.shift();
  return entry;
}

/** Cleans the Markdown and splits it into analysed sentences; the last few results are kept (see `recentTexts`). */
export function analyse(markdown: string): Sentence[] {
  const entry = recentEntry(markdown);
  entry.sentences ??= analyseAfresh(markdown);
  return entry.sentences;
}

/** The analysis itself, of a text not among the recent ones. */
function analyseAfresh(markdown: string): Sentence[] {
  const winkNlp = nlp();
  const { its } = winkNlp;
  const sentences: Sentence[] = [];
  const sentenceInitial: Array<{ token: Token; word: string }> = [];
  let lead = true;
  for (const block of markdownBlocks(markdown)) {
    // Title Case makes wink tag heading words as unlemmatised proper nouns; lower case reads them as words.
    const lower = block.text.toLowerCase();
    const analysed = block.kind === 'heading' && lower.length === block.text.length ? lower : block.text;
    const doc = winkNlp.readDoc(analysed);
    const tokens: Token[] = [];
    const values: string[] = [];
    const starts: number[] = [];
    const ends: number[] = [];
    let cursor = 0;
    doc.tokens().each((token: ItemToken) => {
      const value = token.out();
      const found = analysed.indexOf(value, cursor);
      const start = found === -1 ? cursor : found;
      cursor = found === -1 ? cursor : found + value.length;
      values.push(value);
      starts.push(start);
      ends.push(cursor);
      // wink has no lemma for a few contractions such as "cannot"; the normalised form serves instead.
      const lemma = lemmaOf(token, its) ?? token.out(its.normal);
      tokens.push({
        lemma: lemma.toLowerCase(),
        pos: token.out(its.pos),
        isWord: token.out(its.type) === 'word',
        isStop: token.out(its.stopWordFlag) === true,
        inCode: block.code.some(([from, to]) => start >= from && start < to),
      });
    });
    const ranges: Array<{ first: number; last: number }> = [];
    doc.sentences().each((sentence: ItemSentence) => {
      const sentenceTokens = sentence.tokens();
      const first = sentenceTokens.itemAt(0).index();
      const last = sentenceTokens.itemAt(sentenceTokens.length() - 1).index();
      const previous = ranges.at(-1);
      const start = starts[first] ?? 0;
      const next = analysed.slice(start, start + 1);
      // wink ends sentences inside file names and after code such as `panic!`; the tell is a "sentence" that
      // starts in lower case or with punctuation, or with no space after the previous one.
      const spurious =
        /^[\p{Ll}.,;:)\]}]/u.test(next) || (previous !== undefined && start === ends[previous.last]);
      if (previous !== undefined && spurious) previous.last = last;
      else ranges.push({ first, last });
    });
    for (const { first, last } of ranges) {
      const firstWord = tokens.findIndex((token, index) => index >= first && token.isWord);
      const token = tokens[firstWord];
      const word = values[firstWord] ?? '';
      if (token !== undefined && token.pos === 'PROPN' && /^\p{Lu}\p{Ll}+$/u.test(word)) {
        sentenceInitial.push({ token, word: word.toLowerCase() });
      }
      sentences.push({
        kind: block.kind,
        text: block.text.slice(starts[first] ?? 0, ends[last] ?? block.text.length).trim(),
        tokens: tokens.slice(first, last + 1),
        lead: lead && block.kind === 'prose',
      });
    }
    if (block.kind === 'prose') lead = false;
  }
  relemmatiseSentenceInitial(sentenceInitial, winkNlp);
  return sentences;
}

/**
 * wink reads a capitalised first word such as "Apples" as a proper noun and leaves it unlemmatised; such words
 * are looked up again in lower case, all in one small document.
 */
function relemmatiseSentenceInitial(
  entries: Array<{ token: Token; word: string }>,
  winkNlp: WinkMethods,
): void {
  if (entries.length === 0) return;
  const words = [...new Set(entries.map(({ word }) => word))].sort();
  const lemmas = new Map<string, string>();
  winkNlp
    .readDoc(words.map((word) => `${word}.`).join(' '))
    .tokens()
    .each((token: ItemToken) => {
      const lemma = lemmaOf(token, winkNlp.its);
      if (lemma !== undefined && token.out(winkNlp.its.type) === 'word')
        lemmas.set(token.out(), lemma.toLowerCase());
    });
  for (const { token, word } of entries) token.lemma = lemmas.get(word) ?? token.lemma;
}

/** Counts word, punctuation, number and symbol tokens (not line breaks) as the offline model's usage figure. */
export function countTokens(text: string): number {
  const winkNlp = nlp();
  let count = 0;
  winkNlp
    .readDoc(text)
    .tokens()
    .each((token: ItemToken) => {
      if (token.out(winkNlp.its.type) !== 'tabCRLF') count += 1;
    });
  return count;
}

/** What the offline model is asked: a step's offline answer (its module and input) about one text. */
export interface OfflineRequest {
  /** The module that exports the step's definition, and the export's name (ModelRequest's `offline`). */
  module: string;
  exportName: string;
  text: string;
  input: unknown;
}

export type OfflineAnswer = ModelAnswer<unknown>;

/**
 * One request's answer, with the tokens the text and the answer count (what the offline model's thread runs): the
 * step's own `offlineAnswer`, which reads the text through `analyse` (its analysis shared by the steps of a
 * document). An answer's tokens are its words; a list's, its items.
 */
export function score(request: OfflineRequest): OfflineAnswer {
  const entry = recentEntry(request.text);
  const inputTokens = (entry.tokens ??= countTokens(request.text));
  const value = offlineStep(request.module, request.exportName).offline(request.text, request.input);
  const outputTokens =
    typeof value === 'string'
      ? countTokens(value)
      : Array.isArray(value)
        ? value.length
        : countTokens(JSON.stringify(value));
  return { value, usage: { inputTokens, outputTokens } };
}

/** A step's definition, from the module the asking process found it in (loaded once per thread). */
function offlineStep(path: string, exportName: string): OfflineStep {
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- the thread loads what the asking process named
  const loaded = require(path) as Record<string, Partial<OfflineStep> | undefined>;
  const step = loaded[exportName];
  if (typeof step?.offline !== 'function')
    throw new Error(`${path} exports no step "${exportName}" with an offline(text, input) answer`);
  return step as OfflineStep;
}
