import { formatCost } from './pricing';
import type { BudgetStatus, ScopeStatus } from './rate-limit-store';

/** One line for a budget: `Budget batch-1f2e: spent $0.0120 of $0.0500, 48210 of 200000 tokens (...)`. */
export function describeBudget(budget: BudgetStatus): string {
  const usd =
    budget.limitUsd === null
      ? `${formatCost(budget.spentUsd)} (no dollar limit)`
      : `${formatCost(budget.spentUsd)} of ${formatCost(budget.limitUsd)}`;
  const tokens =
    budget.limitTokens === null
      ? `${budget.spentTokens} tokens (no token limit)`
      : `${budget.spentTokens} of ${budget.limitTokens} tokens`;
  const promised =
    budget.reservedTokens > 0 ? `; ${budget.reservedTokens} tokens promised to calls under way` : '';
  return `Budget ${budget.id}: spent ${usd}, ${tokens}${promised}`;
}

/**
 * One line for a provider's pacing, e.g. `Provider openai-compatible/gpt-4o-mini at http://…: 58 calls in the last
 * minute against 60/min and 200000 tokens/min, 3 refused (429) so far, 12 waiting their turn`.
 */
export function describePacing(status: ScopeStatus): string {
  const { requestsPerMinute, tokensPerMinute } = status.limits;
  const limits = [
    ...(requestsPerMinute === undefined ? [] : [`${requestsPerMinute} calls/min`]),
    ...(tokensPerMinute === undefined ? [] : [`${tokensPerMinute} tokens/min`]),
  ];
  const against = limits.length > 0 ? `against ${limits.join(' and ')}` : 'no limit known yet';
  const refused = `${status.refusals} refused (429)${status.overloads > 0 ? `, ${status.overloads} overloaded` : ''} so far`;
  const waiting = status.waiting > 0 ? `, ${status.waiting} waiting their turn` : '';
  return `Provider ${status.scope}: ${status.callsLastMinute} calls in the last minute ${against}, ${refused}${waiting}`;
}

/**
 * The command that raises what binds: the limit a call of `needed` would pass (tokens, dollars, or both), else each
 * limit the budget has. A dollar figure for a budget held by its tokens would add a limit and leave the one that
 * binds where it is.
 */
export function raiseCommand(
  budget: Pick<BudgetStatus, 'id' | 'limitTokens' | 'limitUsd' | 'spentTokens' | 'spentUsd'>,
  needed?: { tokens: number; usd: number },
): string {
  const tokens = budget.limitTokens !== null;
  const usd = budget.limitUsd !== null;
  const tokensBind =
    tokens && needed !== undefined && budget.spentTokens + needed.tokens > (budget.limitTokens ?? 0);
  const usdBind = usd && needed !== undefined && budget.spentUsd + needed.usd > (budget.limitUsd ?? 0);
  const [t, u] = tokensBind || usdBind ? [tokensBind, usdBind] : [tokens, usd];
  const flags = [...(u ? ['--usd <new total>'] : []), ...(t ? ['--tokens <new total>'] : [])];
  return `npm run budget -- raise ${budget.id} ${flags.length > 0 ? flags.join(' ') : '--usd <new total>'}`;
}

/** How to raise a budget known by its ID only, where its limits are not at hand. */
export function raiseCommandOf(budgetId: string): string {
  return (
    `npm run budget -- raise ${budgetId} --tokens <new total> or --usd <new total> (the limit ` +
    `npm run budget -- show ${budgetId} says is reached)`
  );
}
