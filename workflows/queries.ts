import { defineQuery } from '@temporalio/workflow';
import type { BatchProgress } from '../src/batch-contract';
import type { PipelineProgress } from '../src/steps';

/** Live step states, for progress displays; answered from workflow memory, no history read needed. */
export const progressQuery = defineQuery<PipelineProgress>('progress');

/** The batch's progress: counts, tokens and cost, and the failures listed after the argument's seq. */
export const batchProgressQuery = defineQuery<BatchProgress, [number?]>('batchProgress');
