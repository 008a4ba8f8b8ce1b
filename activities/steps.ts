/**
 * The step list: every step of the pipeline, in order, and what each contributes beyond its activity. Activity
 * registration (activities/index.ts), progress, reports, the result table, the publication's fields and the cost
 * totals all read it; the workflow's calls are written by hand (workflows/index.ts), the one place the order is
 * seen at work. A step's whole definition is its folder, activities/<name>/.
 *
 * The workflow bundle imports this file: it holds names and plain functions only (each step's step.ts), never a
 * schema, so a run does not build the steps' zod schemas in the sandbox.
 */
import type { JsonValue, ModelStepFields } from '../src/contract';
import { publishStep } from './publish/step';
import { summarizeStep } from './summarize/step';
import { tagStep } from './tag/step';
import type { StepDefinition, Typed } from './step-definition';

/** The steps, in order: the model steps first, publish (the one external effect) last. */
export const STEP_LIST = [summarizeStep, tagStep, publishStep] as const;

type Listed = (typeof STEP_LIST)[number];
type ModelListed = Extract<Listed, { model: true }>;
type ResultOf<S> = S extends Typed<never, infer R> ? R : never;
type ActivityOf<S> = S extends Typed<infer I, infer R> ? (input: I) => Promise<R> : never;

/** Each step's activity, under its name: what the workflow's proxies call. */
export type StepActivities = { [S in Listed as S['name']]: ActivityOf<S> };

export type StepName = Listed['name'];
export type ModelStepName = ModelListed['name'];

/** The model steps' results, as a run's result holds them (`summary`, `tags`, ...). */
export type ModelStepResults = {
  [S in ModelListed as S extends { optional: true } ? never : S['resultKey']]: ResultOf<S>;
} & { [S in ModelListed as S extends { optional: true } ? S['resultKey'] : never]?: ResultOf<S> };

/** The model steps' definitions. */
export const MODEL_STEP_LIST = STEP_LIST.filter(
  (step): step is ModelListed => step.model,
) as readonly StepDefinition<ModelStepName>[];

/** The fields the model steps' results put into the publication, in step order. */
export function publicationFields(results: ModelStepResults): Record<string, JsonValue> {
  const fields: Record<string, JsonValue> = {};
  for (const step of STEP_LIST as readonly StepDefinition[]) {
    const result: unknown = (results as Record<string, unknown>)[step.resultKey];
    if (result !== undefined && step.publishes !== undefined) Object.assign(fields, step.publishes(result));
  }
  return fields;
}

/** The model that made a run's results: the first model step's, which the publication records. */
export function modelOf(results: ModelStepResults): ModelStepFields['model'] {
  const first = MODEL_STEP_LIST[0];
  const result =
    first === undefined ? undefined : (results as Record<string, ModelStepFields>)[first.resultKey];
  if (result === undefined) throw new Error('a run has no model step result to name its model');
  return result.model;
}
