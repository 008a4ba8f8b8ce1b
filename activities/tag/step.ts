/** The tag step in the step list (activities/steps.ts): names and plain functions, for the workflow too. */
import { defineStep } from '../step-definition';
import type { TagInput, TagResult } from './schema';

export const tagStep = defineStep<TagInput, TagResult>()({
  name: 'tag',
  model: true,
  resultKey: 'tags',
  publishes: (result) => ({ tags: result.tags }),
  table: { header: 'Tags', cell: (result) => result.tags.join(', ') },
});
