/**
 * The composition root: the face (the step list in activities/, the workflows in workflows/) handed to the kit.
 * Every entry point of src/cli/ imports this first; the tests and benchmarks do too. Besides the entry points, it
 * is the one file that imports both layers: the kit itself never imports the face.
 */
import { steps } from '../../activities';
import type { documentPipeline } from '../../workflows';
import type { DocumentPipeline, PipelineResult as KitPipelineResult } from '../contract';
import { createActivities } from '../steps/activities';
import type { ActivityDependencies } from '../steps/activities';
import type { StepResults } from '../steps/define';
import { usePipeline } from '../steps/registry';
import type { Pipeline } from '../steps/registry';

/** The pipeline this repository defines. */
export const pipeline: Pipeline = { steps, workflowsPath: require.resolve('../../workflows') };

usePipeline(pipeline);

// The face's workflow is what the kit's client starts and queries by its name (DOCUMENT_WORKFLOW).
type Assignable<A, B extends A> = B;
export type FaceWorkflow = Assignable<DocumentPipeline, typeof documentPipeline>;

/** This pipeline's run result: the kit's, with this step list's results (`summary`, `tags`). */
export type PipelineResult = KitPipelineResult<StepResults<typeof steps>>;
/** This pipeline's activities, given the worker's parts. */
export function pipelineActivities(deps: ActivityDependencies) {
  return createActivities(steps, deps);
}
