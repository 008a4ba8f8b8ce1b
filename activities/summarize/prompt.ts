/** What the summarize step asks a model: its instructions, a free-text answer, and its token limit. */
import type { ModelRequest } from '../../src/model/types';
import type { OfflineInput } from './offline';

/** About 120 tokens a sentence of summary, and room for the rest (the pacing reserves the cap before the call). */
export function maxOutputTokens(maxSentences: number): number {
  return 120 * maxSentences + 100;
}

export function summarizeRequest(maxSentences: number): ModelRequest<string> {
  const offline: OfflineInput = { maxSentences };
  return {
    step: 'summarize',
    instructions:
      `Summarize the document above in at most ${maxSentences} sentences of plain prose. ` +
      'Answer with the summary only: no preamble, no Markdown.',
    answer: { kind: 'text', read: (text) => text },
    maxOutputTokens: maxOutputTokens(maxSentences),
    offline: { module: require.resolve('./offline'), input: offline },
  };
}
