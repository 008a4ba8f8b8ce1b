/** The summarize step in the step list (activities/steps.ts): names and plain functions, for the workflow too. */
import { defineStep, modelName } from '../step-definition';
import type { SummarizeInput, SummarizeResult } from './schema';

export const summarizeStep = defineStep<SummarizeInput, SummarizeResult>()({
  name: 'summarize',
  model: true,
  resultKey: 'summary',
  publishes: (result) => ({ summary: result.summary }),
  table: {
    header: 'Model',
    cell: (result) => modelName(result.model),
    detail: (result) => `[${result.model.provider}/${result.model.model}]\n  ${result.summary}`,
  },
});
