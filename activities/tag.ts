import { z } from 'zod';
import { parseOrFail, TagInputSchema } from '../src/contract';
import type { TagInput, TagResult } from '../src/contract';
import { runModelStep } from './model-step';
import type { ModelStepDependencies } from './model-step';

/** Step 2: topic tags for the document, validated as a list of strings. */
export function createTag(deps: ModelStepDependencies) {
  return async function tag(input: TagInput): Promise<TagResult> {
    const { textRef, maxTags } = parseOrFail(TagInputSchema, input, 'tag input');
    const { value, ...answer } = await runModelStep(
      deps,
      { step: 'tag', textRef, input: { maxTags }, valueSchema: z.array(z.string()) },
      (text, call) => deps.model.tag(text, maxTags, call),
    );
    return { tags: value, ...answer };
  };
}
