import { ApplicationFailure } from '@temporalio/common';
import { FailureType } from '../contract';
import type { ModelInfo } from '../contract';
import type { BudgetCut } from '../contract/batch-plain';
import { estimateCost } from '../model/pricing';
import type { PriceTable } from '../model/pricing';
import type { BudgetRef, BudgetStatus } from '../model/rate-limit-store';
import type { BulkRequestRecord, WorstCase } from './types';

/**
 * A request's worst case: every input token it may be billed (BulkApi.worstInputTokens) and its whole token limit
 * answered, priced at the batch price, its input at the dearer of the plain and the cache-write rate (Anthropic's
 * lines mark the document for the prompt cache). A dollar budget and a model without a price cannot be kept.
 */
export function worstCaseOf(
  inputTokens: number,
  maxOutputTokens: number,
  model: { info: ModelInfo; prices: PriceTable },
  budget: BudgetRef,
): WorstCase {
  const usage = { inputTokens, outputTokens: maxOutputTokens };
  const plain = estimateCost(model.prices, model.info, usage, 'batch');
  const written = estimateCost(
    model.prices,
    model.info,
    { ...usage, cacheWriteInputTokens: inputTokens },
    'batch',
  );
  if ((plain === null || written === null) && budget.usd !== undefined)
    throw ApplicationFailure.create({
      type: FailureType.InvalidInput,
      nonRetryable: true,
      message:
        `budget ${budget.id} is in dollars, and the price table has no price for model ${model.info.model}: ` +
        'add it to MODEL_PRICES (docs/cost.md), or give the budget in tokens',
    });
  return { tokens: inputTokens + maxOutputTokens, usd: Math.max(plain ?? 0, written ?? 0) };
}

/**
 * What the budget leaves for a submission: its limit (the stored one; the batch's own before it is stored) less
 * what is spent, promised to calls under way, and `promised` to the round's provider batches not yet collected.
 * A measure without a limit leaves Infinity.
 */
export function budgetLeft(
  status: BudgetStatus | undefined,
  budget: BudgetRef,
  promised: WorstCase,
): WorstCase {
  const limitTokens = status === undefined ? (budget.tokens ?? null) : status.limitTokens;
  const limitUsd = status === undefined ? (budget.usd ?? null) : status.limitUsd;
  const left = (limit: number | null, spent: number, reserved: number, more: number): number =>
    limit === null ? Infinity : limit - spent - reserved - more;
  return {
    tokens: left(limitTokens, status?.spentTokens ?? 0, status?.reservedTokens ?? 0, promised.tokens),
    usd: left(limitUsd, status?.spentUsd ?? 0, status?.reservedUsd ?? 0, promised.usd),
  };
}

/** The worst case of some requests, added up (a request without one counts nothing: claimed before it was kept). */
export function worstOf(records: readonly BulkRequestRecord[]): WorstCase {
  return records.reduce(
    (sum, r) => ({ tokens: sum.tokens + (r.worst?.tokens ?? 0), usd: sum.usd + (r.worst?.usd ?? 0) }),
    { tokens: 0, usd: 0 },
  );
}

/**
 * Cuts a submission to what `left` covers at the requests' worst case, a document at a time (its requests go
 * together, or none of them), in the manifest's order, taking any later document that still fits. What is cut is
 * not lost: it is pending in the next round, and after the last the document's own steps ask for it.
 */
export function cutToBudget(
  records: readonly BulkRequestRecord[],
  left: WorstCase,
  budgetId: string,
): { kept: BulkRequestRecord[]; cut: BudgetCut | undefined } {
  const documents = new Map<string, BulkRequestRecord[]>();
  for (const record of records)
    documents.set(record.workflowId, [...(documents.get(record.workflowId) ?? []), record]);
  const room = { ...left };
  const kept: BulkRequestRecord[] = [];
  let cutRequests = 0;
  let cutDocuments = 0;
  for (const requests of documents.values()) {
    const worst = worstOf(requests);
    if (worst.tokens <= room.tokens && worst.usd <= room.usd) {
      kept.push(...requests);
      room.tokens -= worst.tokens;
      room.usd -= worst.usd;
    } else {
      cutRequests += requests.length;
      cutDocuments++;
    }
  }
  return {
    kept,
    cut: cutRequests === 0 ? undefined : { requests: cutRequests, documents: cutDocuments, budgetId },
  };
}
