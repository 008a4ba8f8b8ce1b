import { BatchInputSchema } from '../src/batch-contract';
import type { CheckedBatchInput } from '../src/batch-contract';
import { parseOrFail, PipelineInputSchema } from '../src/contract';
import type { CheckedPipelineInput } from '../src/contract';

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
