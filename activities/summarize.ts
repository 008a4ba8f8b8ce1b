import { ApplicationFailure } from '@temporalio/activity';
import { z } from 'zod';
import { FailureType, parseOrFail, SummarizeInputSchema } from '../src/contract';
import type { SummarizeInput, SummarizeResult } from '../src/contract';
import { runModelStep } from './model-step';
import type { ModelStepDependencies } from './model-step';
import { timedSync } from './phases';

/** The answer's shape, built once per worker rather than per step. */
const SummarySchema = z.string();

/** Step 1: a summary of the document from the model (or the offline extractive summarizer). */
export function createSummarize(deps: ModelStepDependencies) {
  return async function summarize(input: SummarizeInput): Promise<SummarizeResult> {
    const { textRef, maxSentences, budget } = timedSync(deps.phases, 'input check', () =>
      parseOrFail(SummarizeInputSchema, input, 'summarize input'),
    );
    const { value, ...answer } = await runModelStep(
      deps,
      { step: 'summarize', textRef, input: { maxSentences }, budget, valueSchema: SummarySchema },
      (text, call) => deps.model.summarize(text, maxSentences, call),
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
