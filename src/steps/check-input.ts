import type { z } from 'zod';
import { BatchInputSchema } from '../contract/batch';
import type { CheckedBatchInput } from '../contract/batch';
import { parseOrFail, PipelineInputSchema } from '../contract';
import type { CheckedPipelineInput } from '../contract';
import { timedSync } from '../telemetry/phases';

/**
 * The workflow's input, checked by the worker rather than in the workflow sandbox (a local activity, so no round
 * trip to the server): the schemas are built once per worker process here, where in the sandbox every run would
 * build them again. Bad input fails for good with the same message the workflow gave when it parsed it itself.
 */
export async function checkPipelineInput(rawInput: unknown): Promise<CheckedPipelineInput> {
  return parseOrFail(PipelineInputSchema, rawInput, 'pipeline input');
}

/** The batch workflow's input, checked by the worker for the same reason (see checkPipelineInput). */
export async function checkBatchInput(rawInput: unknown): Promise<CheckedBatchInput> {
  return parseOrFail(BatchInputSchema, rawInput, 'batch input');
}

/** A step's input, checked against its schema (timed as the step's 'input check' phase when the bench times them). */
export function stepInput<S extends z.ZodType>(schema: S, input: unknown, what: string): z.output<S> {
  return timedSync('input check', () => parseOrFail(schema, input, what));
}
