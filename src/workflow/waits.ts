import {
  ActivityFailure,
  ApplicationFailure,
  condition,
  patched,
  setHandler,
  workflowInfo,
} from '@temporalio/workflow';
import { budgetIdOf, FailureType } from '../contract/plain';
import type { PipelineProgress, StepName } from '../contract/plain';
import type { BatchNotices } from './notices';
import { budgetRaisedSignal, budgetWaitSignal } from './queries';

/**
 * The step's own failure when it failed with `type`: a state the run waits out (a held delivery, a budget to
 * raise) rather than a failure of the run.
 */
export function stepFailedWith(err: unknown, type: string): ApplicationFailure | undefined {
  return err instanceof ActivityFailure && err.cause instanceof ApplicationFailure && err.cause.type === type
    ? err.cause
    : undefined;
}

/** How long a step waiting for its budget waits before it looks again by itself (raising it wakes it at once). */
const BUDGET_FIRST_WAIT_MS = 60_000;
const BUDGET_MAX_WAIT_MS = 30 * 60_000;

/**
 * Runs a model step, pausing while its next call would pass the run's budget: the step fails at once with
 * BudgetExhausted (nothing was paid past the budget), the run shows the step waiting for budget and tells its
 * batch, then waits for `npm run budget -- raise` (budgetRaisedSignal) or its timer, and runs the step again under
 * the same activity ID, so the same key: answers already paid for come from the memo.
 */
export function budgetWaiter(progress: PipelineProgress, notices: BatchNotices) {
  let raised = 0;
  setHandler(budgetRaisedSignal, () => void raised++);
  const waiting = new Set<StepName>();
  const tell = (budgetId: string | undefined): Promise<void> =>
    notices.tell(budgetWaitSignal, { workflowId: workflowInfo().workflowId, budgetId });
  return async <T>(name: StepName, run: () => Promise<T>): Promise<T> => {
    for (let waitMs = BUDGET_FIRST_WAIT_MS; ; waitMs = Math.min(waitMs * 2, BUDGET_MAX_WAIT_MS)) {
      const raisedBefore = raised;
      try {
        const result = await run();
        if (waiting.delete(name) && waiting.size === 0) {
          delete progress.budgetId;
          await tell(undefined);
        }
        return result;
      } catch (err) {
        const overBudget = stepFailedWith(err, FailureType.BudgetExhausted);
        if (overBudget === undefined) throw err;
        const budgetId = budgetIdOf(overBudget.details) ?? 'unknown';
        waiting.add(name);
        if (progress.budgetId !== budgetId) {
          progress.budgetId = budgetId;
          await tell(budgetId);
        }
        progress.steps[name] = 'budget';
        // A raise that came while this attempt was being refused (its waiter listed, then woken, before the run
        // heard of the refusal) is this step's too: it goes again at once instead of sleeping through it.
        const seen = raised > raisedBefore && patched('budget-raise-during-attempt') ? raisedBefore : raised;
        await condition(() => raised > seen, waitMs);
        progress.steps[name] = 'running';
      }
    }
  };
}

/** Marks a step running, then done or failed, in the run's progress. */
export async function tracked<T>(
  progress: PipelineProgress,
  name: StepName,
  run: () => Promise<T>,
): Promise<T> {
  progress.steps[name] = 'running';
  try {
    const result = await run();
    progress.steps[name] = 'done';
    return result;
  } catch (err) {
    progress.steps[name] = 'failed';
    throw err;
  }
}
