/** What the tag step asks a model: its instructions, a structured answer (a list of tags), and its token limit. */
import { z } from 'zod';
import { jsonAnswer } from '../../src/model/types';
import type { ModelRequest } from '../../src/model/types';
import type { OfflineInput } from './offline';

/**
 * The structured answer providers are asked for. Lengths are checked by refinements, which stay out of the JSON
 * schema sent to the provider: strict schema modes (OpenAI's, Anthropic's) refuse or drop length keywords, and
 * the answer is validated here anyway.
 */
const TagsAnswerSchema = z.object({
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

/** About 24 tokens a tag of at most 60 characters, and room for the rest. */
export function maxOutputTokens(maxTags: number): number {
  return 24 * maxTags + 60;
}

export function tagRequest(maxTags: number): ModelRequest<string[]> {
  const offline: OfflineInput = { maxTags };
  return {
    step: 'tag',
    instructions: `Give at most ${maxTags} topic tags for the document above: short lowercase tags, most relevant first.`,
    answer: jsonAnswer({
      name: 'tags',
      schema: TagsAnswerSchema,
      // Lowercase, each once, at most the number asked for.
      read: ({ tags }) => [...new Set(tags.map((t) => t.toLowerCase()))].slice(0, maxTags),
    }),
    maxOutputTokens: maxOutputTokens(maxTags),
    offline: { module: require.resolve('./offline'), input: offline },
  };
}
