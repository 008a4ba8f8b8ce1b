import { ActivityFailure, ApplicationFailure, patched, proxyLocalActivities } from '@temporalio/workflow';
import type { CheckedBatchInput } from '../contract/batch';
import { FailureType, refuseOtherSchemaVersions } from '../contract/plain';
import type { CompletePipelineInput } from '../contract/plain';
import type { KitActivities } from '../steps/activities';

/**
 * Runs recorded before the patch `input-checked-in-run` checked their input in a local activity; their histories
 * hold its marker, so they replay through it (patched() is false on replay of a history without the patch).
 */
const { checkPipelineInput, checkBatchInput } = proxyLocalActivities<KitActivities>({
  startToCloseTimeout: '10 seconds',
  retry: { nonRetryableErrorTypes: [FailureType.InvalidInput, FailureType.PayloadRefused] },
});

/**
 * The run's input, checked in the run's first activation before anything waits: deterministic code over the
 * history's own input, so what a replay sees cannot depend on when the first task ended. A local activity did
 * this before: when queries came while it ran, the worker ended the first task with the check's marker alone and
 * the run's patch markers went to the second, while a replay resolves the check within the first task, where no
 * patch is known, so patched() answered false there (TMPRL1100, test/first-task.test.ts). One schema decides:
 * an input it returns unchanged (what the kit's clients send) issues no command, as it never did; anything else is
 * held to it in the run, which fills in defaults and words the failure, behind the patch for older runs.
 */
export async function checkedPipelineInput(rawInput: unknown): Promise<CompletePipelineInput> {
  refuseOtherSchemaVersions(rawInput);
  // An eager import: in the bundle, no chunk and no I/O; the schemas are built in the run that needs them.
  const { completePipelineInput, parseOrFail, PipelineInputSchema } = await import(
    /* webpackMode: "eager" */ '../contract'
  );
  const complete = completePipelineInput(rawInput);
  if (complete !== undefined) return complete;
  if (!patched('input-checked-in-run')) return asRunsOwnCheck(checkPipelineInput(rawInput));
  return parseOrFail(PipelineInputSchema, rawInput, 'pipeline input');
}

/** The batch's input, checked as a document's (checkedPipelineInput). */
export async function checkedBatchInput(rawInput: unknown): Promise<CheckedBatchInput> {
  if (!patched('input-checked-in-run')) return asRunsOwnCheck(checkBatchInput(rawInput));
  const [{ parseOrFail }, { BatchInputSchema }] = await Promise.all([
    import(/* webpackMode: "eager" */ '../contract'),
    import(/* webpackMode: "eager" */ '../contract/batch'),
  ]);
  return parseOrFail(BatchInputSchema, rawInput, 'batch input');
}

/**
 * A worker-side input check (a local activity) as the run's own: its ApplicationFailure fails the run as it is, not
 * wrapped in the ActivityFailure of the activity that made it, so the run says what to fix.
 */
async function asRunsOwnCheck<T>(check: Promise<T>): Promise<T> {
  try {
    return await check;
  } catch (err) {
    if (err instanceof ActivityFailure && err.cause instanceof ApplicationFailure) throw err.cause;
    throw err;
  }
}
