/**
 * An agent step (docs/agent.md): a loop of model turns in which the model calls the tools the step declares, until
 * it calls the answer tool or a limit ends the loop. The workflow drives the loop (src/workflow/agent.ts); each
 * turn is an activity that asks the model once through the memo, and each tool call an activity of its own, keyed
 * `<runId>:<step>:call-<n>`. This file is what a step's folder writes: its definition and its tools.
 */
import type { z } from 'zod';
import type { AgentSummary, BudgetInput, JsonValue, ModelStepFields, Usage } from '../contract';
import type { ModelInfo } from '../contract';
import type { AgentMessage, AgentReply, AgentToolCall } from '../model/types';

/** The fields a step adds to the result and the publication: plain JSON (define.ts's StepFields). */
type StepFields = Record<string, JsonValue>;

/** The tool the model calls to give the step's answer: its input is the step's fields. */
export const ANSWER_TOOL = 'answer';

/** A document of the run's corpus (the batch's documents), as the tools may look into it. */
export interface CorpusDocument {
  documentId: string;
  title: string;
  textRef: string;
}

/** What a tool gets besides its input: the key of its call, the document, the corpus, the texts, the endpoint. */
export interface AgentToolContext {
  /** `<runId>:<step>:call-<n>`: the same on every retry of the call; pass it to anything the tool changes. */
  idempotencyKey: string;
  documentId: string;
  textRef: string;
  /** The batch's documents (the run's own among them); none for a run outside a batch. */
  corpus(): Promise<CorpusDocument[]>;
  /** A document's text, by reference. */
  read(textRef: string): Promise<string>;
  /** Where a tool that changes something sends it (AGENT_TOOL_URL); undefined when unset. */
  toolUrl: string | undefined;
  signal: AbortSignal;
}

/**
 * A tool of an agent step. `changes: false` (it only reads): a retry may run it again. `changes: true`: it is run
 * once per call; a retry after a crash passes the same key, which the receiver dedupes on, and a call whose
 * output was checkpointed is never run again.
 */
export interface AgentTool<I = unknown, O = unknown> {
  description: string;
  input: z.ZodType<I>;
  output: z.ZodType<O>;
  changes: boolean;
  run(input: I, context: AgentToolContext): Promise<O>;
}

/** Defines a tool, its input and output types inferred from its schemas. */
export function agentTool<I, O>(tool: AgentTool<I, O>): AgentTool<I, O> {
  return tool;
}

/** An agent step as its folder writes it; see defineAgentStep. */
export interface AgentStepSpec<
  Name extends string,
  Key extends string,
  Input extends object,
  Fields extends StepFields,
> {
  /** Its activities' names and IDs: turns are `<name>:turn-<n>`, tool calls `<name>:call-<n>`. */
  name: Name;
  resultKey: Key;
  input: z.ZodType<Input>;
  /** The task, given after the document; its words are part of the step's identity. */
  instructions(input: Input): string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- each tool has an input and output of its own
  tools: Record<string, AgentTool<any, any>>;
  /** The answer tool's input, and the fields the step adds to the publication. */
  answer: z.ZodType<Fields>;
  /** Tokens each turn may answer with. */
  maxOutputTokens: number;
  /** The offline model's scripted planner: what it calls in each turn, from the conversation so far. */
  plan(messages: AgentMessage[], input: Input): AgentReply;
}

export interface AgentStepDefinition<
  Name extends string = string,
  Key extends string = string,
  Input extends object = object,
  Fields extends StepFields = StepFields,
> extends AgentStepSpec<Name, Key, Input, Fields> {
  kind: 'agent';
}

/** Defines an agent step (see AgentStepSpec). */
export function defineAgentStep<
  const Name extends string,
  const Key extends string,
  Input extends object,
  Fields extends StepFields,
>(spec: AgentStepSpec<Name, Key, Input, Fields>): AgentStepDefinition<Name, Key, Input, Fields> {
  return { kind: 'agent', ...spec };
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a step of any input and fields
export type AnyAgentStep = AgentStepDefinition<string, string, any, any>;

/** An agent step's result: its answer's fields when it answered, and its loop's turns, tool calls and cost. */
export type AgentStepResult<Fields extends StepFields> = Partial<Fields> &
  ModelStepFields & { agent: AgentSummary };
export type AgentStepResultOf<D> =
  D extends AgentStepDefinition<string, string, object, infer F> ? AgentStepResult<F> : never;

/** A tool call's result, as the next turn reads it: where its output is. */
export interface AgentToolResultRef {
  callId: string;
  tool: string;
  ref: string;
}

/** A turn's input: the document, the step's own input, where the loop stands. */
export interface AgentTurnInput<Input = object> {
  documentId: string;
  textRef: string;
  budget?: BudgetInput | undefined;
  own: Input;
  /** The run whose ID keys the loop's calls: the document's run (kept across the loop's continues as new). */
  keyRunId: string;
  turn: number;
  /** The conversation after the previous turn, in the checkpoint store; absent on the first turn. */
  previousRef?: string | undefined;
  /** The previous turn's tool calls' outputs, to add to the conversation. */
  toolResults: AgentToolResultRef[];
}

/** A turn's result: references, the tools to call and small outcomes, never the conversation itself. */
export interface AgentTurnResult<Fields = StepFields> {
  /** The conversation as sent, with the model's answer, in the checkpoint store. */
  ref: string;
  /** The answer tool's fields, when the model gave a valid answer. */
  answer?: Fields | undefined;
  toolCalls: AgentToolCall[];
  usage: Usage;
  estimatedCostUsd: number | null;
  memoised: boolean;
  model: ModelInfo;
  identity: string;
  idempotencyKey: string;
  /** Characters of the conversation as sent (after compaction), and whether compaction cut it. */
  chars: number;
  compacted: boolean;
}

/** A turn's activity, registered under the step's name (its ID is `<name>:turn-<n>`). */
export type AgentTurnActivity<Input, Fields> = (
  input: AgentTurnInput<Input>,
) => Promise<AgentTurnResult<Fields>>;
