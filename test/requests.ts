/** The shipped steps' model requests, as their activities build them (src/steps/identity.ts's requestOf). */
import { summarize } from '../activities/summarize';
import { tag } from '../activities/tag';
import '../src/cli/compose';
import type { ModelRequest } from '../src/model/types';
import { requestOf } from '../src/steps/identity';
import type { ModelStepResultOf } from '../src/steps/define';

export function summarizeRequest(maxSentences: number): ModelRequest<{ summary: string }> {
  return requestOf(summarize, { maxSentences }) as ModelRequest<{ summary: string }>;
}

export function tagRequest(maxTags: number): ModelRequest<{ tags: string[] }> {
  return requestOf(tag, { maxTags }) as ModelRequest<{ tags: string[] }>;
}

export type SummarizeResult = ModelStepResultOf<typeof summarize>;
export type TagResult = ModelStepResultOf<typeof tag>;
