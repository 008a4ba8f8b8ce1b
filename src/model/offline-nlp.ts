/**
 * The embedded offline model's scoring: extractive summaries and keyword tags computed with wink-nlp from the
 * plain-text blocks of markdown.ts.
 * Everything here is pure and deterministic; the wink model is loaded on first use, not on import.
 */
import winkNLP from 'wink-nlp';
import type { ItemSentence, ItemToken, WinkMethods } from 'wink-nlp';
import model from 'wink-eng-lite-web-model';
import { markdownBlocks } from './markdown';
import type { BlockKind } from './markdown';
import type { ModelAnswer } from './types';

let cachedNlp: WinkMethods | undefined;

/** The wink pipeline, built on first use: instantiating it over the model costs ~200 ms. */
function nlp(): WinkMethods {
  // Only sentence boundaries and parts of speech are needed; NER, sentiment and negation would cost time.
  cachedNlp ??= winkNLP(model, ['sbd', 'pos']);
  return cachedNlp;
}

const CONTENT_POS = new Set(['NOUN', 'PROPN', 'VERB', 'ADJ', 'ADV']);
const TAG_POS = new Set(['NOUN', 'PROPN', 'ADJ']);
const TAG_WORD = /^\p{Ll}[\p{Ll}'’-]*\p{Ll}$/u;
/** Words about the document's layout rather than its subject; never useful as tags. */
const LAYOUT_WORDS = new Set('chapter section listing figure table example filename page'.split(' '));
/** Lemmas wink gets technically right but that read badly as tags. */
const TAG_SPELLING = new Map([['datum', 'data']]);
const HEADING_WEIGHT = 3;
const MAX_SENTENCE_CHARS = 400;

interface Token {
  lemma: string;
  pos: string;
  isWord: boolean;
  isStop: boolean;
  /** Inside an inline code span: an identifier, not a word of the prose. */
  inCode: boolean;
}

interface Sentence {
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
function analyse(markdown: string): Sentence[] {
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

function isContentWord(token: Token): boolean {
  return token.isWord && !token.isStop && CONTENT_POS.has(token.pos) && /\p{L}/u.test(token.lemma);
}

function isTagWord(token: Token): boolean {
  return (
    token.isWord &&
    !token.isStop &&
    !token.inCode &&
    TAG_POS.has(token.pos) &&
    token.lemma.length >= 3 &&
    TAG_WORD.test(token.lemma) &&
    !LAYOUT_WORDS.has(token.lemma)
  );
}

/** How suitable a sentence is as summary prose, independent of its words. */
function sentenceQuality(sentence: Sentence): number {
  let quality = sentence.kind === 'list' ? 0.75 : 1;
  if (sentence.lead) quality *= 1.15;
  // A sentence ending in ':' introduces a code listing or list that the summary will not contain.
  if (/:$/.test(sentence.text)) quality *= 0.5;
  else if (!/[.!?…]["'’”)]*$/.test(sentence.text)) quality *= 0.6;
  // Neither can the summary show a numbered listing, figure or table the sentence points at.
  if (/\b(?:listing|figure|fig\.|table)\s+[A-Z]?\d/i.test(sentence.text)) quality *= 0.7;
  if (sentence.tokens.filter((token) => token.isWord).length < 5) quality *= 0.5;
  return quality;
}

/** Returns up to maxSentences of the most informative sentences of the text, in their original order. */
export function extractiveSummary(text: string, maxSentences: number): string {
  if (maxSentences < 1) return '';
  const sentences = analyse(text);
  const termCounts = new Map<string, number>();
  for (const sentence of sentences) {
    const weight = sentence.kind === 'heading' ? HEADING_WEIGHT : 1;
    for (const token of sentence.tokens) {
      if (isContentWord(token)) termCounts.set(token.lemma, (termCounts.get(token.lemma) ?? 0) + weight);
    }
  }
  const candidates = sentences
    .filter((sentence) => sentence.kind !== 'heading')
    .map((sentence) => ({
      text: sentence.text,
      lemmas: sentence.tokens.filter(isContentWord).map((token) => token.lemma),
      quality: sentenceQuality(sentence),
    }));
  if (candidates.length === 0) {
    return sentences
      .slice(0, maxSentences)
      .map((sentence) => capSentence(sentence.text))
      .join(' ');
  }
  if (candidates.length <= maxSentences) return candidates.map((c) => capSentence(c.text)).join(' ');

  // SumBasic-style selection: score by the probability of the sentence's words, then damp the words covered.
  let total = 0;
  for (const count of termCounts.values()) total += count;
  const probability = new Map<string, number>();
  for (const [lemma, count] of termCounts) probability.set(lemma, count / total);

  const chosen = new Set<number>();
  while (chosen.size < maxSentences) {
    let bestIndex = -1;
    let bestScore = -Infinity;
    candidates.forEach((candidate, index) => {
      if (chosen.has(index)) return;
      let sum = 0;
      for (const lemma of new Set(candidate.lemmas)) sum += probability.get(lemma) ?? 0;
      // Dividing by n^0.6 (n at least 8) rewards substance without letting long sentences win on length alone.
      const score = (sum / Math.pow(Math.max(candidate.lemmas.length, 8), 0.6)) * candidate.quality;
      if (score > bestScore) {
        bestScore = score;
        bestIndex = index;
      }
    });
    const best = candidates[bestIndex];
    if (best === undefined) break;
    chosen.add(bestIndex);
    for (const lemma of new Set(best.lemmas)) {
      const p = probability.get(lemma);
      if (p !== undefined) probability.set(lemma, p * p);
    }
  }
  return [...chosen]
    .sort((a, b) => a - b)
    .map((index) => capSentence(candidates[index]?.text ?? ''))
    .join(' ');
}

function capSentence(sentence: string): string {
  if (sentence.length <= MAX_SENTENCE_CHARS) return sentence;
  const cut = sentence.slice(0, MAX_SENTENCE_CHARS);
  const space = cut.lastIndexOf(' ');
  return `${(space > MAX_SENTENCE_CHARS / 2 ? cut.slice(0, space) : cut).replace(/[\s,;:]+$/, '')}…`;
}

/** Maps plural spellings wink left unlemmatised (e.g. capitalised heading words) to a singular also present. */
function pluralFolds(words: Iterable<string>): Map<string, string> {
  const known = new Set(words);
  const folds = new Map<string, string>();
  for (const word of known) {
    if (word.length < 4 || !word.endsWith('s')) continue;
    const singulars = [word.slice(0, -1)];
    if (word.endsWith('es')) singulars.push(word.slice(0, -2));
    if (word.endsWith('ies')) singulars.push(`${word.slice(0, -3)}y`);
    const singular = singulars.find((candidate) => known.has(candidate));
    if (singular !== undefined) folds.set(word, singular);
  }
  return folds;
}

/** Returns up to maxTags lowercase keyword tags: frequent nouns, adjectives and two-word noun phrases. */
export function keywordTags(text: string, maxTags: number): string[] {
  if (maxTags < 1) return [];
  const words: Array<{ word: string; weight: number; adjective: boolean; follows: boolean }> = [];
  for (const sentence of analyse(text)) {
    const weight = sentence.kind === 'heading' ? HEADING_WEIGHT : 1;
    let follows = false;
    let afterHyphen = false;
    for (const token of sentence.tokens) {
      if (!isTagWord(token)) {
        follows = false;
        afterHyphen = token.lemma === '-';
        continue;
      }
      // A Map, not an object: a lemma such as `constructor` must not find Object.prototype's function.
      const word = TAG_SPELLING.get(token.lemma) ?? token.lemma;
      words.push({ word, weight, adjective: token.pos === 'ADJ', follows });
      // The second half of a compound such as "low-level" cannot start a phrase of its own.
      follows = !afterHyphen;
      afterHyphen = false;
    }
  }
  const folds = pluralFolds(words.map(({ word }) => word));
  const unigrams = new Map<string, number>();
  const bigrams = new Map<string, { weight: number; count: number }>();
  let previous: string | undefined;
  for (const entry of words) {
    const word = folds.get(entry.word) ?? entry.word;
    // Adjectives describe rather than name a topic, so they count for half.
    unigrams.set(word, (unigrams.get(word) ?? 0) + (entry.adjective ? entry.weight / 2 : entry.weight));
    if (entry.follows && previous !== undefined && !entry.adjective && previous !== word) {
      const phrase = `${previous} ${word}`;
      const seen = bigrams.get(phrase) ?? { weight: 0, count: 0 };
      bigrams.set(phrase, { weight: seen.weight + entry.weight, count: seen.count + 1 });
    }
    previous = word;
  }

  const candidates: Array<{ tag: string; words: string[]; score: number }> = [];
  for (const [tag, score] of unigrams) candidates.push({ tag, words: [tag], score });
  for (const [tag, { weight, count }] of bigrams) {
    // A phrase seen once is a coincidence; a repeated one names a concept, more precisely than either word.
    if (count >= 2) candidates.push({ tag, words: tag.split(' '), score: weight * 2 });
  }
  candidates.sort((a, b) => b.score - a.score || (a.tag < b.tag ? -1 : a.tag > b.tag ? 1 : 0));

  const tags: string[] = [];
  const usedWords = new Set<string>();
  for (const candidate of candidates) {
    if (tags.length >= maxTags) break;
    // A phrase and its own words would say the same thing twice; the higher-ranked one wins.
    if (candidate.words.some((word) => usedWords.has(word))) continue;
    tags.push(candidate.tag);
    for (const word of candidate.words) usedWords.add(word);
  }
  return tags;
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

/** What the offline model is asked: a summary or tags of one text. */
export type OfflineRequest =
  { op: 'summarize'; text: string; maxSentences: number } | { op: 'tag'; text: string; maxTags: number };

export type OfflineAnswer = ModelAnswer<string> | ModelAnswer<string[]>;

/** One request's answer, with the tokens the text and the answer count (what the offline model's thread runs). */
export function score(request: OfflineRequest): OfflineAnswer {
  const entry = recentEntry(request.text);
  const inputTokens = (entry.tokens ??= countTokens(request.text));
  if (request.op === 'summarize') {
    const summary = extractiveSummary(request.text, request.maxSentences);
    return { value: summary, usage: { inputTokens, outputTokens: countTokens(summary) } };
  }
  const tags = keywordTags(request.text, request.maxTags);
  return { value: tags, usage: { inputTokens, outputTokens: tags.length } };
}
