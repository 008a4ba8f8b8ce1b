/** Step 2: topic tags for the document, from the model (or, offline, its frequent nouns and noun phrases). */
import { z } from 'zod';
import { defineModelStep, jsonAnswer } from '../../src';
import { keywordTags } from './offline';

/**
 * The structured answer providers are asked for. Lengths are checked by refinements, which stay out of the JSON
 * schema sent to the provider: strict schema modes (OpenAI's, Anthropic's) refuse or drop length keywords.
 */
const TagsAnswer = z.object({
  tags: z
    .array(
      z
        .string()
        .trim()
        .refine((tag) => tag.length > 0, 'must not be empty')
        .refine((tag) => tag.length <= 60, 'must be at most 60 characters'),
    )
    .refine((tags) => tags.length > 0, 'must hold at least one tag')
    .describe('short lowercase topic tags, most relevant first'),
});

export const tag = defineModelStep({
  name: 'tag',
  resultKey: 'tags',
  input: z.object({ maxTags: z.number().int().min(1).max(20) }),
  ask: ({ maxTags }) => ({
    instructions: `Give at most ${maxTags} topic tags for the document above: short lowercase tags, most relevant first.`,
    answer: jsonAnswer({
      name: 'tags',
      schema: TagsAnswer,
      // Lowercase, each once, at most the number asked for.
      read: ({ tags }) => ({ tags: [...new Set(tags.map((t) => t.toLowerCase()))].slice(0, maxTags) }),
    }),
    // About 24 tokens a tag of at most 60 characters, and room for the rest.
    maxOutputTokens: 24 * maxTags + 60,
  }),
  offline: (text, { maxTags }) => ({ tags: keywordTags(text, maxTags) }),
  fields: z.object({
    // A short document may have no word worth a tag: the offline model then gives none.
    tags: z
      .array(z.string().min(1).max(60))
      .max(20)
      .refine((tags) => new Set(tags).size === tags.length, 'must not repeat a tag'),
  }),
  column: { header: 'Tags', cell: (result) => result.tags.join(', ') },
  bulk: (options) => ({ maxTags: options.maxTags }),
});
