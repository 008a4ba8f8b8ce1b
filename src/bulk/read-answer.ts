import { describeIssues } from '../contract';
import type { Usage } from '../contract';
import { excerpt } from '../lib/http';
import type { ModelRequest } from '../model/types';
import type { BulkOutcome } from './types';

/** How a provider said an answer ended, in words both batch APIs map to. */
export type AnswerEnd = 'complete' | 'cut-off' | 'refusal';

/**
 * One answer of a provider batch, read in its step's shape as a direct call's is (ai-sdk.ts): a cut-off, empty or
 * malformed answer is refused with its tokens (it was paid for), a refusal of the document is an error.
 */
export function readAnswer(
  customId: string,
  request: ModelRequest<unknown>,
  answer: { text: string; end: AnswerEnd; usage: Usage; model: string },
): BulkOutcome {
  const { text, end, usage, model } = answer;
  const refused = (error: string): BulkOutcome => ({ customId, kind: 'refused', usage, error });
  if (end === 'refusal')
    return {
      customId,
      kind: 'errored',
      error: `model ${model} refused the document: ${text.trim() === '' ? 'content filter' : text.trim()}`,
    };
  if (end === 'cut-off')
    return refused(`model ${model} was cut off (finish reason "length") before finishing its answer`);
  if (text.trim() === '') return refused(`model ${model} answered with empty content`);
  if (request.answer.kind === 'text')
    return { customId, kind: 'answered', value: request.answer.read(text.trim()), usage };
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return refused(`model ${model} did not answer with JSON; its answer began: ${excerpt(text, 120)}`);
  }
  const shaped = request.answer.schema.safeParse(parsed);
  if (!shaped.success)
    return refused(
      `model ${model} did not answer with the JSON asked for (${describeIssues(shaped.error)}); its answer ` +
        `began: ${excerpt(text, 120)}`,
    );
  return { customId, kind: 'answered', value: request.answer.read(shaped.data), usage };
}
