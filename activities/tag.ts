import { z } from 'zod';
import { parseOrFail, TagInputSchema } from '../src/contract';
import type { TagInput, TagResult } from '../src/contract';
import { runModelStep } from './model-step';
import type { ModelStepDependencies } from './model-step';
import { timedSync } from './phases';

/** The answer's shape, built once per worker rather than per step. */
const TagsSchema = z.array(z.string());

/** Step 2: topic tags for the document, validated as a list of strings. */
export function createTag(deps: ModelStepDependencies) {
  return async function tag(input: TagInput): Promise<TagResult> {
    const { textRef, maxTags, budget } = timedSync(deps.phases, 'input check', () =>
      parseOrFail(TagInputSchema, input, 'tag input'),
    );
    const { value, ...answer } = await runModelStep(
      deps,
      { step: 'tag', textRef, input: { maxTags }, budget, valueSchema: TagsSchema },
      (text, call) => deps.model.tag(text, maxTags, call),
    );
    return { tags: value, ...answer };
  };
}
