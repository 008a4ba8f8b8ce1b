import { ApplicationFailure, Context } from '@temporalio/activity';
import type { Info } from '@temporalio/activity';

/**
 * The idempotency key of the running step: `<workflow run ID>:<activity ID>`. Both parts are fixed for the life
 * of the step, so every retry of it (also the one after a crash) sends the same key; the attempt number is
 * deliberately not part of it. A reset or continue-as-new gets a new run ID, hence a new key.
 */
export function idempotencyKey(info: Info = Context.current().info): string {
  const runId = info.workflowExecution?.runId;
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
