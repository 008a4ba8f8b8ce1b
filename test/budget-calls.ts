/**
 * Budgeted model calls for the budget tests (test/budget-ceiling.test.ts and its killed worker,
 * test/fixtures/budget-call.ts): the project's own client (AiSdkModel), paced and budgeted by the project's Pacer on
 * a real store (SqlRateLimits), asking a provider stand-in (test/billing-provider.ts).
 */
import { z } from 'zod';
import { DEFAULT_PRICES } from '../src/model/pricing';
import { AiSdkModel } from '../src/model/ai-sdk';
import { remoteModel } from '../src/model/choose';
import { Pacer } from '../src/model/pacer';
import { anthropic } from '../src/model/provider-anthropic';
import { openaiCompatible } from '../src/model/provider-openai-compatible';
import type { BudgetRef, SqlRateLimits } from '../src/model/rate-limit-store';
import { jsonAnswer, textAnswer } from '../src/model/types';
import type { ModelRequest } from '../src/model/types';
import { silentLogger } from './helpers';

export type Api = 'openai-compatible' | 'anthropic';

export const MODEL_OF: Record<Api, string> = {
  'openai-compatible': 'gpt-4o-mini',
  anthropic: 'claude-haiku-4-5',
};

/** The client for `api` at `baseUrl`, its calls paced and budgeted on `rateLimits`. */
export function budgetedModel(
  rateLimits: SqlRateLimits,
  options: { api: Api; baseUrl: string; requestTimeoutMs?: number; leaseMs?: number },
): AiSdkModel {
  const provider = options.api === 'anthropic' ? anthropic : openaiCompatible;
  return new AiSdkModel(
    remoteModel(provider, { baseUrl: options.baseUrl, model: MODEL_OF[options.api], apiKey: 'test-key' }),
    options.requestTimeoutMs ?? 10_000,
    (scope, info) =>
      new Pacer(rateLimits, scope, info, {
        prices: DEFAULT_PRICES,
        leaseMs: options.leaseMs ?? 60_000,
        // Known limits far above the tests' calls: nothing waits to learn them.
        settings: { requestsPerMinute: 60_000, tokensPerMinute: 100_000_000 },
        log: silentLogger,
      }),
  );
}

export const MAX_OUTPUT_TOKENS = 200;

const offline = { module: '', exportName: '', input: null };

export const summaryRequest: ModelRequest<string> = {
  step: 'summarize',
  instructions: 'Summarize the document in one sentence, in its own language.',
  answer: textAnswer((text) => text),
  maxOutputTokens: MAX_OUTPUT_TOKENS,
  offline,
};

export const tagsRequest: ModelRequest<string[]> = {
  step: 'tag',
  instructions: 'Give up to five tags for the document, in its own language.',
  answer: jsonAnswer({
    name: 'tags',
    schema: z.object({ tags: z.array(z.string()) }),
    read: (parsed) => parsed.tags,
  }),
  maxOutputTokens: MAX_OUTPUT_TOKENS,
  offline,
};

/** One call under `budget`, as attempt `holdKey` of a step (a retry of the attempt keeps the key). */
export function ask<T>(
  model: AiSdkModel,
  request: ModelRequest<T>,
  text: string,
  place: { holdKey: string; budget: BudgetRef; signal?: AbortSignal },
): Promise<{ value: T }> {
  return model.ask(request, text, {
    idempotencyKey: place.holdKey,
    signal: place.signal ?? new AbortController().signal,
    pacing: {
      step: request.step,
      workflowId: `wf-${place.holdKey}`,
      budget: place.budget,
      attemptEndsAt: Infinity,
      stepEndsAt: Infinity,
    },
  });
}

/** Chinese running text of about `chars` characters: a document in a script that tokenizes densely. */
export function chineseText(chars: number, seed = 0): string {
  const sentence =
    '持久化工作流在进程崩溃后从最后完成的步骤继续执行，已经付费的模型回答会被重复使用，而不会再次购买。' +
    '每个文档的摘要、标签和发布都是独立的活动，失败时按照预算和重试策略处理。';
  const chars_ = [...sentence];
  let out = `第${seed}号文档。`;
  for (let i = 0; out.length < chars; i++) out += chars_[(i + seed) % chars_.length];
  return out;
}

/** The stand-in's answers: a sentence of Chinese, or the tags JSON. */
export function chineseAnswer(_request: unknown, wantsJson: boolean): string {
  return wantsJson ? '{"tags": ["工作流", "预算"]}' : '本文说明持久化工作流如何在崩溃后继续。';
}
