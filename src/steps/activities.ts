import type { BlobStore } from '../documents/blobs';
import type { Publisher } from '../publisher/types';
import { createBatchActivities } from '../batch/activities';
import { createBulkActivities } from '../bulk/activities';
import type { BulkDependencies } from '../bulk/activities';
import { checkBatchInput, checkPipelineInput } from './check-input';
import type { StepActivities, StepList } from './define';
import { modelStepActivity } from './model-step';
import type { ModelStepDependencies } from './model-step';
import { publishActivity } from './publish';
import { agentToolActivity, agentToolActivityName, agentTurnActivity } from './agent-activities';
import type { AgentStepDependencies } from './agent-activities';

/** The model steps' parts (model, memo, texts, prices; without prices only the offline model costs 0) and the publisher. */
export interface ActivityDependencies
  extends ModelStepDependencies, Pick<AgentStepDependencies, 'checkpoints' | 'agentToolUrl'> {
  publisher: Publisher;
  /** The texts' store; the batch workflow reads its manifest from it. */
  blobs: BlobStore;
  /** The provider's batch API and the claims of its batches (bulk mode); absent for a model without one. */
  bulk?: BulkDependencies['bulk'];
}

/**
 * The pipeline's activities with their dependencies injected (tests pass real-but-local parts): each step of the
 * list under its name, from its definition, and the kit's own (the batch's, bulk mode's, the input checks).
 */
export function createActivities<S extends StepList>(steps: S, deps: ActivityDependencies) {
  const own = Object.fromEntries(
    steps.flatMap((step): [string, unknown][] =>
      step.kind === 'agent'
        ? [
            // An agent step's turn is registered under its name, its tool calls beside it.
            [step.name, agentTurnActivity(step, deps)],
            [agentToolActivityName(step.name), agentToolActivity(step, deps)],
          ]
        : [[step.name, step.kind === 'model' ? modelStepActivity(step, deps) : publishActivity(deps)]],
    ),
  );
  return {
    // Each entry is the activity its definition's kind makes, under the definition's name.
    ...(own as StepActivities<S>),
    ...createBatchActivities(deps),
    ...createBulkActivities(steps, deps),
    checkPipelineInput,
    checkBatchInput,
  };
}

/** The kit's own activities, which the kit's workflows (the batch, bulk mode, the input check) call. */
export type KitActivities = ReturnType<typeof createActivities<[]>>;
