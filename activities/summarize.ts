import { ApplicationFailure } from '@temporalio/activity';
import { z } from 'zod';
import type { AnswerMemo } from '../src/model/memo';
import type { PriceTable } from '../src/model/pricing';
import type { DocumentModel } from '../src/model/types';
import { FailureType, parseOrFail, SummarizeInputSchema } from '../src/shared';
import type { SummarizeInput, SummarizeResult } from '../src/shared';
import type { TextSource } from './document-text';
import { withHeartbeats } from './heartbeat';
import { idempotencyKey } from './idempotency';
import { askOnce } from './model-step';

/** Step 1: a summary of the document from the model (or the offline extractive summarizer). */
export function createSummarize(deps: {
  model: DocumentModel;
  memo: AnswerMemo;
  texts: TextSource;
  prices?: PriceTable;
}) {
  return async function summarize(input: SummarizeInput): Promise<SummarizeResult> {
    const { textRef, maxSentences } = parseOrFail(SummarizeInputSchema, input, 'summarize input');
    const key = idempotencyKey();
    const text = deps.texts.read(textRef);
    const { value, ...answer } = await withHeartbeats((signal) =>
      askOnce(
        {
          step: 'summarize',
          key,
          memo: deps.memo,
          model: deps.model,
          valueSchema: z.string(),
          prices: deps.prices,
        },
        () => deps.model.summarize(text, maxSentences, { idempotencyKey: key, signal }),
      ),
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
    return { summary: value, idempotencyKey: key, ...answer };
  };
}
