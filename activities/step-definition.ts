import type { JsonValue } from '../src/contract';

/**
 * The shape of a step's entry in the step list (activities/steps.ts), which each step's step.ts defines: what a step
 * is beyond its activity; `Result` is what its activity returns.
 */
export interface StepDefinition<Name extends string = string, Key extends string = string, Result = unknown> {
  /** The step's name: its activity's name and ID, so idempotency keys read `<runId>:<name>`. */
  name: Name;
  /** A model step: its answer comes through the memo, and its result carries usage and cost (ModelStepFields). */
  model: boolean;
  /** Where the run's result holds the step's result (`summary` for summarize). */
  resultKey: Key;
  /** Some runs' results lack it: a step added behind `patched()`, which runs recorded before it replay without. */
  optional?: true;
  /** The fields the step puts into the publication. */
  publishes?: (result: Result) => Record<string, JsonValue>;
  /** The step's column in the result table, and the line it adds under it for each document. */
  table?: { header: string; cell(result: Result): string; detail?(result: Result): string };
}

/**
 * Defines a step, keeping its literal name, key and kind, and its activity's input and result types, for the types
 * the list derives (the activities' types among them: the step's activity is its folder's `create(deps)`).
 */
export function defineStep<Input, Result>() {
  return <const D extends StepDefinition<string, string, Result>>(definition: D): D & Typed<Input, Result> =>
    definition;
}

/** A step definition's activity types, carried by its type alone. */
export interface Typed<Input, Result> {
  readonly activityType?: (input: Input) => Promise<Result>;
}

/** A model as the result table names it: `provider/model`, or just `offline` for the offline model. */
export function modelName(model: { provider: string; model: string }): string {
  return model.provider === 'offline' ? 'offline' : `${model.provider}/${model.model}`;
}
