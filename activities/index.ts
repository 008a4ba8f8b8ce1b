import type { BlobStore } from '../src/documents/blobs';
import type { Publisher } from '../src/publisher/types';
import { createBatchActivities } from './batch';
import { createBulkActivities } from './bulk';
import type { BulkDependencies } from './bulk';
import { checkBatchInput, checkPipelineInput } from './check-input';
import type { ModelStepDependencies } from './model-step';
import { STEP_LIST } from './steps';
import type { StepActivities } from './steps';

/** The model steps' parts (model, memo, texts, prices; without prices only the offline model costs 0) and the publisher. */
export interface ActivityDependencies extends ModelStepDependencies {
  publisher: Publisher;
  /** The texts' store; the batch workflow reads its manifest from it. */
  blobs: BlobStore;
  /** The provider's batch API and the claims of its batches (bulk mode); absent for a model without one. */
  bulk?: BulkDependencies['bulk'];
}

/** What each step's folder exports (activities/<step>/index.ts): its activity, given the worker's parts. */
interface StepModule {
  create(deps: ActivityDependencies): (input: never) => Promise<unknown>;
}

/**
 * The pipeline's activities with their dependencies injected (tests pass real-but-local parts): each step of the
 * step list, from its folder, and the batch workflow's own.
 */
export function createActivities(deps: ActivityDependencies) {
  const steps = Object.fromEntries(STEP_LIST.map(({ name }) => [name, stepModule(name).create(deps)]));
  return {
    ...(steps as StepActivities),
    ...createBatchActivities(deps),
    ...createBulkActivities(deps),
    checkPipelineInput,
    checkBatchInput,
  };
}

export type PipelineActivities = ReturnType<typeof createActivities>;

/** A step's folder, by the step's name. */
function stepModule(name: string): StepModule {
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- the folder the step list names
  const loaded = require(`./${name}`) as Partial<StepModule>;
  if (typeof loaded.create !== 'function')
    throw new Error(`activities/${name}/index.ts exports no create(deps): every step's folder needs one`);
  return loaded as StepModule;
}
