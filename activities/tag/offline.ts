/**
 * The tag step's offline answer: keyword tags, the text's frequent nouns, adjectives and repeated two-word noun
 * phrases, read with the offline model's analysis (src/model/offline-nlp.ts). The offline model's thread runs it (the step's `offline`, in index.ts).
 */
import { analyse, HEADING_WEIGHT } from '../../src';
import type { Token } from '../../src';

const TAG_POS = new Set(['NOUN', 'PROPN', 'ADJ']);
const TAG_WORD = /^\p{Ll}[\p{Ll}'’-]*\p{Ll}$/u;
/** Words about the document's layout rather than its subject; never useful as tags. */
const LAYOUT_WORDS = new Set('chapter section listing figure table example filename page'.split(' '));
/** Lemmas wink gets technically right but that read badly as tags. */
const TAG_SPELLING = new Map([['datum', 'data']]);

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
