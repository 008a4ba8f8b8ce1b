import type { ModelInfo } from '../contract';
import type { PriceTable } from './pricing';

/**
 * The most a provider may bill for one call, which is what a budget holds for it before it is sent: a budget is a
 * ceiling on the bill, not on an estimate. No tokenizer of the providers here has a token of less than one byte of
 * UTF-8 (they are byte-level: a character the vocabulary lacks costs one token per byte), so a prompt's bytes
 * bound its tokens in any script, Chinese or emoji included, where a count of characters does not (a CJK character
 * is often one to three tokens). The API's own wrapping of a request (message markers, the tool-use system prompt
 * Anthropic adds for a forced tool, a few hundred tokens) is FRAMING_TOKENS on top; the answer may use all of its
 * maxOutputTokens.
 */
export const FRAMING_TOKENS = 512;

/** UTF-8 bytes of the texts a request sends: what its input tokens cannot pass. */
export function utf8Bytes(...texts: string[]): number {
  return texts.reduce((sum, text) => sum + Buffer.byteLength(text, 'utf8'), 0);
}

/** The most tokens a call may be billed: its prompt's bytes, the API's framing, and its whole answer. */
export function worstCaseTokens(promptBytes: number, maxOutputTokens: number): number {
  return Math.ceil(promptBytes) + FRAMING_TOKENS + maxOutputTokens;
}

/**
 * The most a call may cost in dollars: every input token at the dearest rate the price has for input (a prompt
 * cache write is 1.25x the plain rate at Anthropic: a request that marks its document for the cache may be billed
 * that on all of it), and the whole answer at the output rate. Null without a price; 0 for the offline model.
 */
export function worstCaseUsd(
  prices: PriceTable,
  model: ModelInfo,
  inputTokens: number,
  outputTokens: number,
): number | null {
  if (model.provider === 'offline') return 0;
  const price = prices[model.model];
  if (price === undefined) return null;
  const input = Math.max(
    price.inputPerMillion,
    price.cachedInputPerMillion ?? 0,
    price.cacheWritePerMillion ?? 0,
  );
  return (inputTokens * input + outputTokens * price.outputPerMillion) / 1_000_000;
}
