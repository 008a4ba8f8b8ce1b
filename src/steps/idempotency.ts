import { ApplicationFailure, Context } from '@temporalio/activity';
import type { Info } from '@temporalio/activity';

/**
 * The idempotency key of the running step: `<workflow run ID>:<activity ID>`. Both parts are fixed for the life
 * of the step, so every retry of it (also the one after a crash) sends the same key; the attempt number is
 * deliberately not part of it. A reset gets a new run ID, hence a new key: an operator redoing the run.
 *
 * `keyRunId` is the one exception, for a delivery that outlives its run: a held publish waits for a verdict for as
 * long as it takes, and its run continues as new (a new run ID) before its history reaches Temporal's limit. That
 * is still the same delivery: the receiver or the ledger may hold it under the first run's key, the verdict is
 * given on that key, and a new key would be a second delivery of it. So the continued run passes the first run's
 * ID and the key stays `<first run ID>:<activity ID>`.
 */
export function idempotencyKey(info: Info = Context.current().info, keyRunId?: string): string {
  const runId = keyRunId ?? info.workflowExecution?.runId;
  // Standalone activities (started by a client, not a workflow) have no run to key on.
  if (runId === undefined) {
    throw ApplicationFailure.create({
      type: 'MissingWorkflowRun',
      nonRetryable: true,
      message: `activity ${info.activityId} runs outside a workflow, so it has no run ID to build its key from`,
    });
  }
  return `${runId}:${info.activityId}`;
}
