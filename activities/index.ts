import type { BlobStore } from '../src/documents/blobs';
import type { Publisher } from '../src/publisher/types';
import { createBatchActivities } from './batch';
import { checkBatchInput, checkPipelineInput } from './check-input';
import type { ModelStepDependencies } from './model-step';
import { createPublish } from './publish';
import { createSummarize } from './summarize';
import { createTag } from './tag';

/** The model steps' parts (model, memo, texts, prices; without prices only the offline model costs 0) and the publisher. */
export interface ActivityDependencies extends ModelStepDependencies {
  publisher: Publisher;
  /** The texts' store; the batch workflow reads its manifest from it. */
  blobs: BlobStore;
}

/** The pipeline's activities with their dependencies injected; tests pass real-but-local parts. */
export function createActivities(deps: ActivityDependencies) {
  return {
    summarize: createSummarize(deps),
    tag: createTag(deps),
    publish: createPublish(deps),
    ...createBatchActivities(deps),
    checkPipelineInput,
    checkBatchInput,
  };
}

export type PipelineActivities = ReturnType<typeof createActivities>;
