import type { Publisher } from '../src/publisher/types';
import type { ModelStepDependencies } from './model-step';
import { createPublish } from './publish';
import { createSummarize } from './summarize';
import { createTag } from './tag';

/** The model steps' parts (model, memo, texts, prices; without prices only the offline model costs 0) and the publisher. */
export interface ActivityDependencies extends ModelStepDependencies {
  publisher: Publisher;
}

/** The pipeline's activities with their dependencies injected; tests pass real-but-local parts. */
export function createActivities(deps: ActivityDependencies) {
  return {
    summarize: createSummarize(deps),
    tag: createTag(deps),
    publish: createPublish(deps),
  };
}

export type PipelineActivities = ReturnType<typeof createActivities>;
