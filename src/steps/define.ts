/**
 * What a step is: one typed definition in its folder (activities/<step>/index.ts), from which the kit derives its
 * activity and registration, its types, its memo identity, its column in the result table, the publication's
 * fields, what a reviewer may edit, and how bulk mode asks it. The step list (activities/index.ts) is an array of
 * these; the composition root hands it to the kit.
 */
import type { z } from 'zod';
import type { BudgetInput, JsonValue, ModelStepFields, PipelineOptions } from '../contract';
import type { PublishInput, PublishResult } from '../contract';
import { PUBLISH_STEP } from '../contract/plain';
import type { JsonAnswer, TextAnswer } from '../model/types';
import type { AgentStepDefinition, AgentStepResultOf, AgentTurnActivity, AnyAgentStep } from './agent';

/** The fields a step adds to the run's result and the publication (`{ summary }`, `{ tags }`): plain JSON. */
export type StepFields = Record<string, JsonValue>;

/** What a model step asks, given its input: the task (after the document), the answer's shape, its token limit. */
export interface StepAsk<Fields extends StepFields> {
  instructions: string;
  answer: TextAnswer<Fields> | JsonAnswer<Fields>;
  /** Sent with the request, and reserved by the pacing and the budget before it. */
  maxOutputTokens: number;
}

/** What the kit gives every model step besides the step's own input: the document, by reference, and a budget. */
export interface DocumentStepInput {
  documentId: string;
  textRef: string;
  budget?: BudgetInput | undefined;
}

/** A model step as its folder writes it; see defineModelStep. */
export interface ModelStepSpec<
  Name extends string,
  Key extends string,
  Input extends object,
  Fields extends StepFields,
> {
  /** Its activity's name and ID, so idempotency keys read `<runId>:<name>`. */
  name: Name;
  /** Where the run's result keeps the step's result (`summary` for summarize). */
  resultKey: Key;
  /** The step's own input (beyond the document), as the worker checks it. */
  input: z.ZodType<Input>;
  /** What the step asks a model. Its words, answer schema and token limit are part of the step's identity. */
  ask(input: Input): StepAsk<Fields>;
  /**
   * The answer of the offline model (the embedded default, no key needed), run on the offline model's thread.
   * Its folder's source is part of the step's identity when the model is offline.
   */
  offline(text: string, input: Input): Fields;
  /**
   * The step's result rules: an answer that breaks them is refused before the memo keeps it, what the memo reads
   * back is checked against them, and a reviewer's edit of these fields is held to them (src/steps/review-edits.ts).
   */
  fields: z.ZodType<Fields>;
  /** Why the document cannot go through this step (the answer is empty, say), as a message saying what to fix. */
  refuse?(fields: Fields): string | undefined;
  /** The step's column in the result table, and the line it adds under it for each document. */
  column?: {
    header: string;
    cell(result: Fields & ModelStepFields): string;
    detail?(result: Fields & ModelStepFields): string;
  };
  /** Bulk mode (docs/bulk.md): the step's input for a batch's options. A step without it is asked one by one. */
  bulk?(options: PipelineOptions): Input;
}

/** A model step's definition: its spec, marked as a model step. */
export interface ModelStepDefinition<
  Name extends string = string,
  Key extends string = string,
  Input extends object = object,
  Fields extends StepFields = StepFields,
> extends ModelStepSpec<Name, Key, Input, Fields> {
  kind: 'model';
}

/** The publish step: the one external effect, last. The kit's publisher carries it out, under PUBLISH_STEP. */
export interface PublishStepDefinition {
  kind: 'publish';
  name: typeof PUBLISH_STEP;
  resultKey: 'publication';
}

/** Defines a model step (see ModelStepSpec); a mismatch between what it declares and what it returns is a type error. */
export function defineModelStep<
  const Name extends string,
  const Key extends string,
  Input extends object,
  Fields extends StepFields,
>(spec: ModelStepSpec<Name, Key, Input, Fields>): ModelStepDefinition<Name, Key, Input, Fields> {
  return { kind: 'model', ...spec };
}

/** Defines the publish step (its activity ID is `publish`: keys read `<runId>:publish`). */
export function definePublishStep(): PublishStepDefinition {
  return { kind: 'publish', name: PUBLISH_STEP, resultKey: 'publication' };
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a step of any input and fields
export type AnyModelStep = ModelStepDefinition<string, string, any, any>;
export type AnyStep = AnyModelStep | AnyAgentStep | PublishStepDefinition;
/** A pipeline's steps, in order: the model steps, then publish. */
export type StepList = readonly AnyStep[];

type ModelOf<S extends StepList> = Extract<S[number], { kind: 'model' }>;
type AgentOf<S extends StepList> = Extract<S[number], { kind: 'agent' }>;
type InputOf<D> = D extends ModelStepDefinition<string, string, infer I, StepFields> ? I : never;
type FieldsOf<D> = D extends ModelStepDefinition<string, string, object, infer F> ? F : never;

/** A model step's result, as its activity returns it: its fields, and the key, model, tokens and cost. */
export type ModelStepResultOf<D> = FieldsOf<D> & ModelStepFields;

/** Each step's activity, under its name: what the workflow's proxies call. */
export type StepActivities<S extends StepList> = {
  [D in S[number] as D['name']]: D extends { kind: 'model' }
    ? (input: DocumentStepInput & InputOf<D>) => Promise<ModelStepResultOf<D>>
    : D extends AgentStepDefinition<string, string, infer I, infer F>
      ? AgentTurnActivity<I, F>
      : (input: PublishInput) => Promise<PublishResult>;
};

/** The model steps' results, as a run's result holds them (`summary`, `tags`, ...). */
export type StepResults<S extends StepList> = {
  [D in ModelOf<S> as D['resultKey']]: ModelStepResultOf<D>;
} & {
  // An agent step runs only when the run's input turns agent steps on: its result may be absent.
  [D in AgentOf<S> as D['resultKey']]?: AgentStepResultOf<D> | undefined;
};

/** The model steps of a list. */
export function modelSteps(steps: StepList): AnyModelStep[] {
  return steps.filter((step): step is AnyModelStep => step.kind === 'model');
}

/** A model as the result table names it: `provider/model`, or just `offline` for the offline model. */
export function modelName(model: { provider: string; model: string }): string {
  return model.provider === 'offline' ? 'offline' : `${model.provider}/${model.model}`;
}
