import { log } from '@temporalio/activity';
import type { z } from 'zod';
import type { AnswerMemo } from '../src/model/memo';
import { estimateCost } from '../src/model/pricing';
import type { PriceTable } from '../src/model/pricing';
import type { DocumentModel, ModelAnswer, ModelCall } from '../src/model/types';
import type { ModelInfo, StepName, Usage } from '../src/contract';
import type { TextSource } from '../src/documents/text-source';
import { withHeartbeats } from './heartbeat';
import { idempotencyKey } from './idempotency';

/** What the two model steps need: the model, the memo of paid answers, the texts, and prices for cost. */
export interface ModelStepDependencies {
  model: DocumentModel;
  memo: AnswerMemo;
  texts: TextSource;
  prices?: PriceTable;
}

export interface ModelStepAnswer<T> {
  value: T;
  usage: Usage;
  model: ModelInfo;
  memoised: boolean;
  estimatedCostUsd: number | null;
}

/**
 * Asks the model at most once per idempotency key. The answer is written to the durable memo before the activity
 * returns; an attempt that finds one (its predecessor died after paying) reuses it instead of calling again.
 */
export async function askOnce<T>(
  {
    step,
    key,
    memo,
    model,
    valueSchema,
    prices = {},
  }: {
    step: StepName;
    key: string;
    memo: AnswerMemo;
    model: DocumentModel;
    valueSchema: z.ZodType<T>;
    prices?: PriceTable;
  },
  ask: () => Promise<ModelAnswer<T>>,
): Promise<ModelStepAnswer<T>> {
  const stored = memo.get(key);
  if (stored !== undefined) {
    const value = valueSchema.safeParse(stored.value);
    if (value.success) {
      log.info('Reusing the memoised model answer: an earlier attempt paid for it', { step, key });
      const estimatedCostUsd = estimateCost(prices, stored.model, stored.usage);
      return {
        value: value.data,
        usage: stored.usage,
        model: stored.model,
        memoised: true,
        estimatedCostUsd,
      };
    }
    log.warn('Ignoring a memoised answer that no longer fits the schema', { step, key });
  }
  const answer = await ask();
  memo.put(key, step, { value: answer.value, usage: answer.usage, model: model.info });
  const estimatedCostUsd = estimateCost(prices, model.info, answer.usage);
  return { value: answer.value, usage: answer.usage, model: model.info, memoised: false, estimatedCostUsd };
}

/**
 * The body shared by summarize and tag: read the text by reference, then ask the model once per idempotency key
 * (see askOnce) while heartbeating. `ask` gets the text and the call's key and cancellation signal.
 */
export async function runModelStep<T>(
  deps: ModelStepDependencies,
  { step, textRef, valueSchema }: { step: StepName; textRef: string; valueSchema: z.ZodType<T> },
  ask: (text: string, call: ModelCall) => Promise<ModelAnswer<T>>,
): Promise<ModelStepAnswer<T> & { idempotencyKey: string }> {
  const key = idempotencyKey();
  const text = deps.texts.read(textRef);
  const answer = await withHeartbeats((signal) =>
    askOnce({ step, key, memo: deps.memo, model: deps.model, valueSchema, prices: deps.prices }, () =>
      ask(text, { idempotencyKey: key, signal }),
    ),
  );
  return { ...answer, idempotencyKey: key };
}
