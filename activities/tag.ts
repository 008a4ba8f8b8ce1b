import { z } from 'zod';
import type { AnswerMemo } from '../src/model/memo';
import type { PriceTable } from '../src/model/pricing';
import type { DocumentModel } from '../src/model/types';
import { parseOrFail, TagInputSchema } from '../src/shared';
import type { TagInput, TagResult } from '../src/shared';
import type { TextSource } from './document-text';
import { withHeartbeats } from './heartbeat';
import { idempotencyKey } from './idempotency';
import { askOnce } from './model-step';

/** Step 2: topic tags for the document, validated as a list of strings. */
export function createTag(deps: {
  model: DocumentModel;
  memo: AnswerMemo;
  texts: TextSource;
  prices?: PriceTable;
}) {
  return async function tag(input: TagInput): Promise<TagResult> {
    const { textRef, maxTags } = parseOrFail(TagInputSchema, input, 'tag input');
    const key = idempotencyKey();
    const text = deps.texts.read(textRef);
    const { value, ...answer } = await withHeartbeats((signal) =>
      askOnce(
        {
          step: 'tag',
          key,
          memo: deps.memo,
          model: deps.model,
          valueSchema: z.array(z.string()),
          prices: deps.prices,
        },
        () => deps.model.tag(text, maxTags, { idempotencyKey: key, signal }),
      ),
    );
    return { tags: value, idempotencyKey: key, ...answer };
  };
}
