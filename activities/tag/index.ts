/** Step 2: topic tags for the document, validated as a list of strings. */
import type { PipelineOptions } from '../../src/contract';
import type { ModelRequest } from '../../src/model/types';
import { stepInput } from '../check-input';
import { runModelStep } from '../model-step';
import type { ModelStepDependencies } from '../model-step';
import { tagRequest } from './prompt';
import { TagInputSchema, TagsSchema } from './schema';
import type { TagInput, TagResult } from './schema';

/** What the step asks in bulk mode (activities/bulk.ts): as summarize's. */
export const bulk = {
  input: (options: PipelineOptions) => ({ maxTags: options.maxTags }),
  request: (input: { maxTags: number }): ModelRequest<string[]> => tagRequest(input.maxTags),
};

export function create(deps: ModelStepDependencies) {
  return async function tag(input: TagInput): Promise<TagResult> {
    const { textRef, maxTags, budget } = stepInput(TagInputSchema, input, 'tag input');
    const request = tagRequest(maxTags);
    const { value, ...answer } = await runModelStep(
      deps,
      { step: 'tag', textRef, input: { maxTags }, budget, valueSchema: TagsSchema },
      (text, call) => deps.model.ask(request, text, call),
    );
    return { tags: value, ...answer };
  };
}
