/** Step 1: a summary of the document from the model (or the offline extractive summarizer). */
import { ApplicationFailure } from '@temporalio/activity';
import { FailureType } from '../../src/contract';
import type { PipelineOptions } from '../../src/contract';
import type { ModelRequest } from '../../src/model/types';
import { stepInput } from '../check-input';
import { runModelStep } from '../model-step';
import type { ModelStepDependencies } from '../model-step';
import { summarizeRequest } from './prompt';
import { SummarizeInputSchema, SummarySchema } from './schema';
import type { SummarizeInput, SummarizeResult } from './schema';

/**
 * What the step asks in bulk mode (activities/bulk.ts): the input that shapes its answer, from the batch's options
 * (as create's activity gives runModelStep, so both share one memo key), and the request that input makes.
 */
export const bulk = {
  input: (options: PipelineOptions) => ({ maxSentences: options.maxSummarySentences }),
  request: (input: { maxSentences: number }): ModelRequest<string> => summarizeRequest(input.maxSentences),
};

export function create(deps: ModelStepDependencies) {
  return async function summarize(input: SummarizeInput): Promise<SummarizeResult> {
    const { textRef, maxSentences, budget } = stepInput(SummarizeInputSchema, input, 'summarize input');
    const request = summarizeRequest(maxSentences);
    const { value, ...answer } = await runModelStep(
      deps,
      { step: 'summarize', textRef, input: { maxSentences }, budget, valueSchema: SummarySchema },
      (text, call) => deps.model.ask(request, text, call),
    );
    if (value.trim() === '') {
      throw ApplicationFailure.create({
        type: FailureType.InvalidDocument,
        nonRetryable: true,
        message:
          `document ${textRef} has no prose to summarize (only code, tables or markup are left once those are ` +
          'set aside); add some text, or leave it out of the batch',
      });
    }
    return { summary: value, ...answer };
  };
}
