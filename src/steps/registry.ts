/**
 * The pipeline (its step list and workflows), as the composition root hands it to the kit (src/cli/compose.ts):
 * the worker registers its activities and bundles its workflows from it, and the client side (progress lines,
 * reports, the result table) reads the steps. The kit never imports the face itself.
 */
import type { AnyModelStep, StepList } from './define';
import { modelSteps } from './define';

/** The face as the kit is given it: the step list, and the module of the workflows (for the worker's bundle). */
export interface Pipeline {
  steps: StepList;
  workflowsPath: string;
}

let registered: Pipeline | undefined;

/** Hands the pipeline to the kit; the composition root calls it once, before anything reads it. */
export function usePipeline(pipeline: Pipeline): void {
  registered = pipeline;
}

/** The pipeline handed in; a clear error where no composition root has run. */
export function registeredPipeline(): Pipeline {
  if (registered !== undefined) return registered;
  throw new Error(
    'no step list was handed to the kit: import the composition root (src/cli/compose.ts) before using the ' +
      "kit's client or worker (an entry point of src/cli/ does)",
  );
}

/** The step list handed in. */
export function registeredSteps(): StepList {
  return registeredPipeline().steps;
}

/**
 * The names of the steps a document's history records as activities, in order. An agent step's loop is a child
 * workflow of its own (src/workflow/agent.ts), and runs only when the run's input turns it on: its turns and
 * calls are in the loop's history, and the step's result says what they came to (src/runs/agent-lines.ts).
 */
export function stepNames(): string[] {
  return registeredSteps()
    .filter((step) => step.kind !== 'agent')
    .map((step) => step.name);
}

/** The model steps handed in. */
export function registeredModelSteps(): AnyModelStep[] {
  return modelSteps(registeredSteps());
}
