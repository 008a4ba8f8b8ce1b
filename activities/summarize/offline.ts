/**
 * The summarize step's offline answer: an extractive summary, the most informative sentences of the text in their
 * order, read with the offline model's analysis (src/model/offline-nlp.ts). The offline model's thread runs it (the step's `offline`, in index.ts).
 */
import { analyse, HEADING_WEIGHT } from '../../src';
import type { Sentence, Token } from '../../src';

const CONTENT_POS = new Set(['NOUN', 'PROPN', 'VERB', 'ADJ', 'ADV']);
const MAX_SENTENCE_CHARS = 400;

function isContentWord(token: Token): boolean {
  return token.isWord && !token.isStop && CONTENT_POS.has(token.pos) && /\p{L}/u.test(token.lemma);
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
