import type { z } from 'zod';
import type { ModelInfo, Usage } from '../contract';
import type { BudgetRef } from './rate-limit-store';

export interface ModelCall {
  /** `<runId>:<activityId>`: sent as the Idempotency-Key header so a provider that dedupes can do so. */
  idempotencyKey: string;
  /** Aborts the request when the activity is cancelled or times out. */
  signal: AbortSignal;
  /**
   * Why the previous paid answer to this request was refused (cut off, wrong shape). A retry must not repeat the
   * identical request: the model gets this quoted back, and the structured output and token limit it needs.
   */
  retryHint?: string;
  /**
   * Where the call stands in its step, for the fleet's pacing of a provider's calls and the run's budget
   * (pacer.ts); the call's key is its place in the queue. Absent: the call is sent unpaced.
   */
  pacing?: CallPacing;
}

export interface CallPacing {
  step: string;
  /** The run to wake when a budget it waits for is raised. */
  workflowId: string;
  budget?: BudgetRef | undefined;
  /**
   * What a budget's refusal of this call does: the run waits for a raise (`waits`, the default), or the agent loop
   * the call is a turn of ends with outcome `budget` and the run goes on without its answer (`ends-loop`).
   */
  onBudgetRefused?: 'waits' | 'ends-loop' | undefined;
  /** This attempt's start-to-close deadline and the step's schedule-to-close one, on this worker's clock. */
  attemptEndsAt: number;
  stepEndsAt: number;
}

export interface ModelAnswer<T> {
  value: T;
  usage: Usage;
}

/**
 * What a model step asks, in the one form every model answers: the step's instructions about the document, the
 * shape of the answer, and its token limit. The kit builds it from the step's definition (src/steps/identity.ts);
 * nothing in src/model/ knows one step from another.
 */
export interface ModelRequest<T> {
  /** The step asking: sent as the x-pipeline-step header, for servers and proxies that tell requests apart. */
  step: string;
  /** The task, given after the document. */
  instructions: string;
  /** The answer's shape: free text, or a JSON value following a schema. */
  answer: TextAnswer<T> | JsonAnswer<T>;
  /** The most tokens the answer may use: sent with the request, and reserved by the pacing before it. */
  maxOutputTokens: number;
  /**
   * Where the step's offline answer lives, for the offline model's thread (a function cannot cross to a thread):
   * the module that exports the step's definition, the export's name, and the step's input to answer.
   */
  offline: { module: string; exportName: string; input: unknown };
}

/** A free-text answer: `read` turns the trimmed text (never empty: an empty answer is refused) into the step's value. */
export interface TextAnswer<T> {
  kind: 'text';
  read(text: string): T;
}

/**
 * A structured answer: the provider is asked for JSON following `schema` (named `name`, as providers want), and
 * `read` turns the parsed value into the step's value.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- each step's schema has an output type of its own
export interface JsonAnswer<T, A = any> {
  kind: 'json';
  name: string;
  schema: z.ZodType<A>;
  read(parsed: A): T;
}

/** A free-text answer, read into the step's value. */
export function textAnswer<T>(read: (text: string) => T): TextAnswer<T> {
  return { kind: 'text', read };
}

/** A structured answer, its parsed type inferred from the schema. */
export function jsonAnswer<A, T>(answer: Omit<JsonAnswer<T, A>, 'kind'>): JsonAnswer<T, A> {
  return { kind: 'json', ...answer };
}

/** A step's definition as the offline model's thread finds it in its module: its offline answer. */
export interface OfflineStep {
  offline(text: string, input: unknown): unknown;
}

/** The model port: every model step asks through `ask`. Implementations: offline (embedded) and AiSdkModel (ai-sdk.ts). */
export interface DocumentModel {
  readonly info: ModelInfo;
  /**
   * The version of the framing every request shares (the system line, the document's markers: prompt-frame.ts);
   * part of every step's identity. A step's own words are in its identity already (src/steps/identity.ts).
   */
  readonly promptVersion: string;
  ask<T>(request: ModelRequest<T>, text: string, call: ModelCall): Promise<ModelAnswer<T>>;
}

/** A tool call the model asked for in a turn: its ID (the provider's, or the planner's), the tool, its input. */
export interface AgentToolCall {
  callId: string;
  tool: string;
  input: unknown;
}

/**
 * A message of an agent's conversation, as the conversation store keeps it and every model is sent it: the
 * task (with the document), the model's turns, and the tools' results. Provider-neutral; ai-sdk.ts turns it into
 * the AI SDK's messages.
 */
export type AgentMessage =
  | { role: 'user'; text: string }
  | { role: 'assistant'; text: string; toolCalls: AgentToolCall[] }
  | { role: 'tool'; results: { callId: string; tool: string; output: unknown; isError: boolean }[] };

/** A tool as the model is told of it: its name, what it does, its input's JSON schema. */
export interface AgentToolSpec {
  name: string;
  description: string;
  inputSchema: Record<string, unknown>;
}

/** One model turn of an agent step: the conversation as sent, the tools it may call, its token limit. */
export interface AgentTurnRequest {
  step: string;
  system: string;
  messages: AgentMessage[];
  tools: AgentToolSpec[];
  maxOutputTokens: number;
  /** The step's scripted planner, for the offline model: the module exporting the definition, and its input. */
  offline: { module: string; exportName: string; input: unknown };
}

/** The model's turn: what it said, and the tools it calls (none: it is done, or answered in words only). */
export interface AgentReply {
  text: string;
  toolCalls: AgentToolCall[];
}

/** A step's definition as the offline model finds it in its module: its scripted planner. */
export interface OfflinePlanner {
  plan(messages: AgentMessage[], input: unknown): AgentReply;
}

/** A model that takes agent turns (tool calling): the offline model's planner, every AI SDK provider. */
export interface AgentModel {
  converse(request: AgentTurnRequest, call: ModelCall): Promise<ModelAnswer<AgentReply>>;
}

/** True when `model` takes agent turns. */
export function takesAgentTurns(model: DocumentModel): model is DocumentModel & AgentModel {
  return typeof (model as Partial<AgentModel>).converse === 'function';
}
