/** The summarize step's input and result, as the worker checks them. */
import { z } from 'zod';
import {
  BudgetInputSchema,
  DocumentIdSchema,
  ModelStepFieldsSchema,
  TextRefSchema,
} from '../../src/contract';

export const SummarizeInputSchema = z
  .object({
    documentId: DocumentIdSchema,
    textRef: TextRefSchema,
    maxSentences: z.number().int().min(1).max(20),
    budget: BudgetInputSchema.optional(),
  })
  .strict();
export type SummarizeInput = z.infer<typeof SummarizeInputSchema>;

/** The answer's shape, as the memo keeps it. */
export const SummarySchema = z.string();

export const SummarizeResultSchema = ModelStepFieldsSchema.extend({ summary: SummarySchema });
export type SummarizeResult = z.infer<typeof SummarizeResultSchema>;
