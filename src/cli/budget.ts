import './compose';
import { parseArgs } from 'node:util';
import { budgetRaisedSignal } from '../workflow/queries';
import { loadConfig } from '../config';
import type { Config } from '../config';
import { runMain, UserFacingError } from '../lib/run-main';
import { describeBudget, describePacing, raiseCommand } from '../model/pacing-status';
import type { BudgetStatus } from '../model/rate-limit-store';
import { openStores } from '../store/open';
import { connectClient } from '../temporal/connection';

const USAGE = [
  'Usage:',
  '  npm run budget                                       budgets with runs waiting on them, and the pacing of each provider',
  '  npm run budget -- show <id>                          one budget: its limits, what is spent and promised',
  '  npm run budget -- raise <id> [--usd N] [--tokens N]  set a budget\'s limits (N: the new total, or "none"), and',
  '                                                       wake the runs waiting on it',
].join('\n');

/**
 * `npm run budget`: the budgets of tokens and dollars that batches (`--budget-usd`, `--budget-tokens`) and runs
 * carry. A model step whose next call would pass its budget pauses its run (shown as waiting for budget) instead
 * of paying past it; raising the budget here wakes those runs, which go on from where they paused.
 */
async function run(): Promise<void> {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: {
      usd: { type: 'string' },
      tokens: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help === true) {
    console.log(USAGE);
    return;
  }
  const [command, id] = positionals;
  const known =
    command === undefined ||
    command === 'list' ||
    ((command === 'show' || command === 'raise') && id !== undefined);
  if (!known) {
    console.error(USAGE);
    process.exitCode = 2;
    return;
  }
  const limits = {
    ...(values.usd === undefined ? {} : { usd: measureOf('--usd', values.usd, false) }),
    ...(values.tokens === undefined ? {} : { tokens: measureOf('--tokens', values.tokens, true) }),
  };
  if (command === 'raise' && Object.keys(limits).length === 0)
    throw new UserFacingError(
      `raise needs --usd N or --tokens N (or both): the budget's new total\n${USAGE}`,
    );
  const config = loadConfig();
  const stores = await openStores(config);
  try {
    const limiter = stores.rateLimits;
    if (command === 'show' && id !== undefined) {
      const budget = await limiter.budget(id);
      if (budget === undefined)
        throw new UserFacingError(`no budget is called "${id}"; npm run budget lists them`);
      console.log(describeBudget(budget));
    } else if (command === 'raise' && id !== undefined) {
      const before = await limiter.budget(id);
      if (before === undefined)
        throw new UserFacingError(`no budget is called "${id}"; npm run budget lists them`);
      refuseBelowPromised(before, limits);
      const raised = await limiter.setBudget(id, limits);
      if (raised === undefined) throw new UserFacingError(`no budget is called "${id}"`);
      console.log(`Raised: ${describeBudget(raised.budget)}`);
      await wake(config, raised.woken);
    } else {
      const waiting = await limiter.waitingBudgets();
      if (waiting.length === 0) console.log('No run waits for a budget.');
      for (const { budget, workflowIds } of waiting) {
        console.log(describeBudget(budget));
        console.log(`  ${workflowIds.length} run(s) waiting: ${workflowIds.slice(0, 10).join(', ')}`);
        console.log(`  raise it: ${raiseCommand(budget)}`);
      }
      for (const scope of await limiter.scopes()) {
        const status = await limiter.status(scope, config.modelLimits);
        if (status !== undefined) console.log(describePacing(status));
      }
    }
  } finally {
    await stores.close();
  }
}

/** A new total from the command line: a positive number, or `none` to lift the limit. */
function measureOf(flag: string, raw: string, whole: boolean): number | null {
  if (raw === 'none') return null;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0 || (whole && !Number.isInteger(n)))
    throw new UserFacingError(
      `${flag} must be a positive ${whole ? 'whole ' : ''}number or "none", not "${raw}"`,
    );
  return n;
}

/**
 * A limit below what is spent already would pause every run for good, and one below what is spent and promised to
 * calls under way would be passed by those calls as they end (they were let go under the old limit): refused,
 * saying what is spent and promised.
 */
function refuseBelowPromised(
  budget: BudgetStatus,
  limits: { usd?: number | null; tokens?: number | null },
): void {
  const usd = budget.spentUsd + budget.reservedUsd;
  if (typeof limits.usd === 'number' && limits.usd < usd)
    throw new UserFacingError(
      `--usd ${limits.usd} is below what budget ${budget.id} has spent ($${budget.spentUsd.toFixed(6)}) and ` +
        `promised to calls under way ($${budget.reservedUsd.toFixed(6)}): give at least $${usd.toFixed(6)}`,
    );
  const tokens = budget.spentTokens + budget.reservedTokens;
  if (typeof limits.tokens === 'number' && limits.tokens < tokens)
    throw new UserFacingError(
      `--tokens ${limits.tokens} is below what budget ${budget.id} has spent (${budget.spentTokens} tokens) and ` +
        `promised to calls under way (${budget.reservedTokens}): give at least ${tokens}`,
    );
}

/**
 * Tells each waiting run to try its step again now rather than at its next timer (up to 30 minutes away).
 * Without a Temporal server to tell, it says when they look again by themselves.
 */
async function wake(config: Config, workflowIds: readonly string[]): Promise<void> {
  if (workflowIds.length === 0) return;
  try {
    const { client, close } = await connectClient(config, { connectTimeout: '5 seconds' });
    try {
      let told = 0;
      for (const workflowId of workflowIds) {
        // A run that ended meanwhile has nothing to wake.
        const ok = await client.workflow
          .getHandle(workflowId)
          .signal(budgetRaisedSignal)
          .then(
            () => true,
            () => false,
          );
        if (ok) told++;
      }
      console.log(`Woke ${told} waiting run(s): their steps go on now.`);
    } finally {
      await close();
    }
  } catch {
    console.log(
      `${workflowIds.length} waiting run(s) were not told (no Temporal server answered): they look again by ` +
        'themselves within 30 min.',
    );
  }
}

runMain(run);
