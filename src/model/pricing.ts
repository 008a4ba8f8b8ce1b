import { z } from 'zod';
import type { ModelInfo, Usage } from '../contract';

export const ModelPriceSchema = z
  .object({
    /** US dollars per million input (prompt) tokens. */
    inputPerMillion: z.number().min(0),
    /** US dollars per million output (completion) tokens. */
    outputPerMillion: z.number().min(0),
  })
  .strict();

/**
 * Model name (as in MODEL, after the provider) -> price. A configurable estimate, not a bill: check your
 * provider's current prices.
 */
export const PriceTableSchema = z.record(z.string().min(1), ModelPriceSchema);
export type PriceTable = z.infer<typeof PriceTableSchema>;

/**
 * Prices used when MODEL_PRICES does not say otherwise (US dollars per million tokens, list prices of
 * late 2025; Anthropic's input tokens include cache reads and writes, priced here as plain input). Local
 * models (Ollama, vLLM, LM Studio) are free to call: give them a 0 price in MODEL_PRICES.
 */
export const DEFAULT_PRICES: PriceTable = {
  'gpt-4o-mini': { inputPerMillion: 0.15, outputPerMillion: 0.6 },
  'gpt-4o': { inputPerMillion: 2.5, outputPerMillion: 10 },
  'gpt-4.1-mini': { inputPerMillion: 0.4, outputPerMillion: 1.6 },
  'gpt-4.1': { inputPerMillion: 2, outputPerMillion: 8 },
  'claude-haiku-4-5': { inputPerMillion: 1, outputPerMillion: 5 },
  'claude-sonnet-4-5': { inputPerMillion: 3, outputPerMillion: 15 },
};

/** Estimated cost in US dollars: 0 for the offline model, null when the table has no price for the model. */
export function estimateCost(prices: PriceTable, model: ModelInfo, usage: Usage): number | null {
  if (model.provider === 'offline') return 0;
  const price = prices[model.model];
  if (price === undefined) return null;
  return (
    (usage.inputTokens * price.inputPerMillion + usage.outputTokens * price.outputPerMillion) / 1_000_000
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
): {
  inputTokens: number;
  outputTokens: number;
  costUsd: number | null;
} {
  let costUsd: number | null = 0;
  for (const step of steps) {
    const cost = step.estimatedCostUsd;
    costUsd = costUsd === null || cost === null || cost === undefined ? null : costUsd + cost;
  }
  return {
    // Paid answers the step refused are tokens spent too.
    inputTokens: steps.reduce((sum, s) => sum + s.usage.inputTokens + (s.rejectedUsage?.inputTokens ?? 0), 0),
    outputTokens: steps.reduce(
      (sum, s) => sum + s.usage.outputTokens + (s.rejectedUsage?.outputTokens ?? 0),
      0,
    ),
    costUsd,
  };
}
