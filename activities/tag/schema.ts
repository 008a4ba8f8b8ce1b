/** The tag step's input and result, as the worker checks them. */
import { z } from 'zod';
import {
  BudgetInputSchema,
  DocumentIdSchema,
  ModelStepFieldsSchema,
  TextRefSchema,
} from '../../src/contract';

export const TagInputSchema = z
  .object({
    documentId: DocumentIdSchema,
    textRef: TextRefSchema,
    maxTags: z.number().int().min(1).max(20),
    budget: BudgetInputSchema.optional(),
  })
  .strict();
export type TagInput = z.infer<typeof TagInputSchema>;

/** The answer's shape, as the memo keeps it. */
export const TagsSchema = z.array(z.string());

export const TagResultSchema = ModelStepFieldsSchema.extend({ tags: TagsSchema });
export type TagResult = z.infer<typeof TagResultSchema>;
