import { z } from 'zod';
import type { ModelInfo, Usage } from '../contract';

export const ModelPriceSchema = z
  .object({
    /** US dollars per million input (prompt) tokens. */
    inputPerMillion: z.number().min(0),
    /** US dollars per million output (completion) tokens. */
    outputPerMillion: z.number().min(0),
    /** US dollars per million input tokens read from the provider's prompt cache; the input price when absent. */
    cachedInputPerMillion: z.number().min(0).optional(),
    /** US dollars per million input tokens written to the prompt cache (Anthropic's); the input price when absent. */
    cacheWritePerMillion: z.number().min(0).optional(),
    /**
     * The share of these prices a provider's batch API charges (bulk mode, docs/bulk.md): OpenAI's Batch API and
     * Anthropic's Message Batches both charge half; 0.5 when absent.
     */
    batchShare: z.number().min(0).max(1).optional(),
  })
  .strict();

/** What a provider's batch API charges of its list prices where the table does not say (both charge half). */
export const DEFAULT_BATCH_SHARE = 0.5;

/** How an answer was bought: one call at list prices, or a line of a provider batch at the batch price. */
export type PriceTier = 'direct' | 'batch';

/**
 * Model name (as in MODEL, after the provider) -> price. A configurable estimate, not a bill: check your
 * provider's current prices.
 */
export const PriceTableSchema = z.record(z.string().min(1), ModelPriceSchema);
export type PriceTable = z.infer<typeof PriceTableSchema>;

/**
 * Prices used when MODEL_PRICES does not say otherwise (US dollars per million tokens, list prices of late 2025).
 * Cached input is what each provider charges for input served from its prompt cache: OpenAI half off on the
 * gpt-4o family and three quarters off on gpt-4.1, with cache writes at the input price; Anthropic 0.1x the input
 * price for cache reads and 1.25x for 5-minute cache writes. Local models (Ollama, vLLM, LM Studio) are free to
 * call: give them a 0 price in MODEL_PRICES.
 */
export const DEFAULT_PRICES: PriceTable = {
  'gpt-4o-mini': { inputPerMillion: 0.15, cachedInputPerMillion: 0.075, outputPerMillion: 0.6 },
  'gpt-4o': { inputPerMillion: 2.5, cachedInputPerMillion: 1.25, outputPerMillion: 10 },
  'gpt-4.1-mini': { inputPerMillion: 0.4, cachedInputPerMillion: 0.1, outputPerMillion: 1.6 },
  'gpt-4.1': { inputPerMillion: 2, cachedInputPerMillion: 0.5, outputPerMillion: 8 },
  'claude-haiku-4-5': {
    inputPerMillion: 1,
    cachedInputPerMillion: 0.1,
    cacheWritePerMillion: 1.25,
    outputPerMillion: 5,
  },
  'claude-sonnet-4-5': {
    inputPerMillion: 3,
    cachedInputPerMillion: 0.3,
    cacheWritePerMillion: 3.75,
    outputPerMillion: 15,
  },
};

/** Estimated cost in US dollars: 0 for the offline model, null when the table has no price for the model. */
export function estimateCost(
  prices: PriceTable,
  model: ModelInfo,
  usage: Usage,
  tier: PriceTier = 'direct',
): number | null {
  if (model.provider === 'offline') return 0;
  const price = prices[model.model];
  if (price === undefined) return null;
  // inputTokens counts every input token; the cache's share of them is priced at the cache's rates.
  const cached = usage.cachedInputTokens ?? 0;
  const written = usage.cacheWriteInputTokens ?? 0;
  const plain = Math.max(0, usage.inputTokens - cached - written);
  const share = tier === 'batch' ? (price.batchShare ?? DEFAULT_BATCH_SHARE) : 1;
  return (
    (share *
      (plain * price.inputPerMillion +
        cached * (price.cachedInputPerMillion ?? price.inputPerMillion) +
        written * (price.cacheWritePerMillion ?? price.inputPerMillion) +
        usage.outputTokens * price.outputPerMillion)) /
    1_000_000
  );
}

/** Formats a cost for tables: `$0.000123`, or `n/a` without a price. */
export function formatCost(cost: number | null | undefined): string {
  if (cost === null || cost === undefined) return 'n/a';
  return `$${cost.toFixed(6)}`;
}

/** Tokens and cost of some model steps added up; the cost is null when any step's model had no price. */
export function totalUsage(
  steps: readonly { usage: Usage; rejectedUsage?: Usage | undefined; estimatedCostUsd?: number | null }[],
): Required<Usage> & { costUsd: number | null } {
  let costUsd: number | null = 0;
  for (const step of steps) {
    const cost = step.estimatedCostUsd;
    costUsd = costUsd === null || cost === null || cost === undefined ? null : costUsd + cost;
  }
  // Paid answers the step refused are tokens spent too.
  const sum = (count: (usage: Usage) => number | undefined): number =>
    steps.reduce(
      (total, s) =>
        total + (count(s.usage) ?? 0) + (s.rejectedUsage === undefined ? 0 : (count(s.rejectedUsage) ?? 0)),
      0,
    );
  return {
    inputTokens: sum((u) => u.inputTokens),
    outputTokens: sum((u) => u.outputTokens),
    cachedInputTokens: sum((u) => u.cachedInputTokens),
    cacheWriteInputTokens: sum((u) => u.cacheWriteInputTokens),
    costUsd,
  };
}

/** Tokens in/out for tables, with the cached share when there is one: `1200/85 tok` or `1200 (900 cached)/85 tok`. */
export function formatTokens(usage: Usage): string {
  const cached = usage.cachedInputTokens ?? 0;
  return `${usage.inputTokens}${cached > 0 ? ` (${cached} cached)` : ''}/${usage.outputTokens} tok`;
}
