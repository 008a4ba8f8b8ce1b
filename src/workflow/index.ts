/**
 * The kit's workflow-side API, safe in Temporal's sandbox (no I/O, no Node builtins): what workflows/ uses to
 * write a document's pipeline, and the kit's own workflows, which the face's workflow module exports for the
 * worker's bundle. The worker-side API is src/index.ts.
 */
export { runDocument } from './document';
export type { DocumentRun } from './document';
export { batch } from './batch';
export { agentLoop } from './agent';
export {
  batchProgressQuery,
  budgetRaisedSignal,
  deliverySettledSignal,
  noticesWantedSignal,
  progressQuery,
  reviewQuery,
  reviewUpdate,
  reviewWaitSignal,
} from './queries';
export type { PipelineContinuation, PipelineResult } from '../contract';
export type { StepActivities, StepResults } from '../steps/define';
