import type { z } from 'zod';
import { BatchInputSchema } from '../contract/batch';
import type { CheckedBatchInput } from '../contract/batch';
import { parseOrFail, PipelineInputSchema } from '../contract';
import type { CheckedPipelineInput } from '../contract';
import { timedSync } from '../telemetry/phases';

/**
 * The local activity that checked a run's input before the run checked it itself (src/workflow/checks.ts): kept
 * registered for runs started before that, which replay through it and may retry it.
 */
export async function checkPipelineInput(rawInput: unknown): Promise<CheckedPipelineInput> {
  return parseOrFail(PipelineInputSchema, rawInput, 'pipeline input');
}

/** The batch's input, as checkPipelineInput checks a document's (kept for runs started before the same change). */
export async function checkBatchInput(rawInput: unknown): Promise<CheckedBatchInput> {
  return parseOrFail(BatchInputSchema, rawInput, 'batch input');
}

/** A step's input, checked against its schema (timed as the step's 'input check' phase when the bench times them). */
export function stepInput<S extends z.ZodType>(schema: S, input: unknown, what: string): z.output<S> {
  return timedSync('input check', () => parseOrFail(schema, input, what));
}
