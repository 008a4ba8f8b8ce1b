/** Step 1: a summary of the document, from the model (or, offline, its most informative sentences). */
import { z } from 'zod';
import { defineModelStep, modelName, textAnswer } from '../../src';
import { extractiveSummary } from './offline';

export const summarize = defineModelStep({
  name: 'summarize',
  resultKey: 'summary',
  input: z.object({ maxSentences: z.number().int().min(1).max(20) }),
  ask: ({ maxSentences }) => ({
    instructions:
      `Summarize the document above in at most ${maxSentences} sentences of plain prose. ` +
      'Answer with the summary only: no preamble, no Markdown.',
    answer: textAnswer((summary) => ({ summary })),
    // About 120 tokens a sentence, and room for the rest.
    maxOutputTokens: 120 * maxSentences + 100,
  }),
  offline: (text, { maxSentences }) => ({ summary: extractiveSummary(text, maxSentences) }),
  fields: z.object({ summary: z.string().max(20_000) }),
  refuse: ({ summary }) =>
    summary.trim() === ''
      ? 'it has no prose to summarize (only code, tables or markup are left once those are set aside); add ' +
        'some text, or leave it out of the batch'
      : undefined,
  column: {
    header: 'Model',
    cell: (result) => modelName(result.model),
    detail: (result) => `[${result.model.provider}/${result.model.model}]\n  ${result.summary}`,
  },
  bulk: (options) => ({ maxSentences: options.maxSummarySentences }),
});
