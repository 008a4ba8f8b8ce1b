import type { AnswerMemo } from '../src/model/memo';
import type { PriceTable } from '../src/model/pricing';
import type { DocumentModel } from '../src/model/types';
import type { Publisher } from '../src/publisher/types';
import type { TextSource } from './document-text';
import { createPublish } from './publish';
import { createSummarize } from './summarize';
import { createTag } from './tag';

export interface ActivityDependencies {
  model: DocumentModel;
  publisher: Publisher;
  memo: AnswerMemo;
  texts: TextSource;
  /** For cost estimates in step results; without it only the offline model has a known price (0). */
  prices?: PriceTable;
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
