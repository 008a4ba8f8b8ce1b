import { createHash } from 'node:crypto';
import { Context, log } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import { describeIssues, FailureType } from '../contract';
import { ManifestReader } from '../documents/manifest';
import type { BlobStore } from '../documents/blobs';
import { canonicalJson } from '../lib/canonical-json';
import { memoKeyFor } from '../model/memo';
import { documentBlock, SYSTEM } from '../model/prompt-frame';
import { takesAgentTurns } from '../model/types';
import type { AgentMessage, AgentReply, AgentToolSpec, AgentTurnRequest } from '../model/types';
import { inSpan } from '../telemetry/spans';
import type { AgentToolCallRecord } from '../contract';
import type { SqlAgentCheckpoints } from './agent-store';
import { ANSWER_TOOL } from './agent';
import type {
  AgentToolContext,
  AgentTurnInput,
  AgentTurnResult,
  AnyAgentStep,
  CorpusDocument,
} from './agent';
import { withHeartbeats } from './heartbeat';
import { idempotencyKey } from './idempotency';
import { definitionModule } from './identity';
import { callSignal, deadlinesOf, memoCallOf, PaidCalls } from './model-step';
import type { ModelStepDependencies } from './model-step';

/**
 * Characters of conversation past which a turn compacts it before it is sent and saved: the tools' outputs of
 * all but the last two tool messages are replaced by a note of their size (the task, the document, the model's
 * calls and the recent outputs stay). Deterministic, so a retried turn sends and saves the same conversation.
 */
export const COMPACT_PAST_CHARS = 24_000;
/** Tool messages whose outputs compaction keeps whole: the most recent ones. */
const KEEP_RECENT_TOOL_MESSAGES = 2;

/** What agent steps need besides a model step's parts: their checkpoints, the texts' blobs, the tool endpoint. */
export interface AgentStepDependencies extends ModelStepDependencies {
  checkpoints?: SqlAgentCheckpoints | undefined;
  blobs: BlobStore;
  /** AGENT_TOOL_URL: where a tool that changes something sends it. */
  agentToolUrl?: string | undefined;
}

const AgentReplySchema: z.ZodType<AgentReply> = z.object({
  text: z.string(),
  toolCalls: z.array(z.object({ callId: z.string(), tool: z.string(), input: z.unknown() })),
});

const MessagesSchema = z.array(z.record(z.string(), z.unknown()));

const ToolOutputSchema = z.object({ output: z.unknown(), isError: z.boolean() });

/** A tool call's input, as the loop's workflow passes it. */
export interface AgentToolInput {
  documentId: string;
  textRef: string;
  keyRunId: string;
  n: number;
  callId: string;
  tool: string;
  input: unknown;
  corpusRef?: string | undefined;
}

function checkpointsOf(deps: AgentStepDependencies, step: string): SqlAgentCheckpoints {
  if (deps.checkpoints !== undefined) return deps.checkpoints;
  throw ApplicationFailure.create({
    type: FailureType.InvalidInput,
    nonRetryable: true,
    message: `agent step ${step} has no checkpoint store: give the worker's dependencies theirs (createDependencies does)`,
  });
}

/** The tools as the model is told of them: the step's, and the answer tool, whose input is the step's fields. */
function toolSpecs(step: AnyAgentStep): AgentToolSpec[] {
  const tools = Object.entries(step.tools).map(([name, tool]) => ({
    name,
    description: tool.description,
    inputSchema: z.toJSONSchema(tool.input, { io: 'input' }) as Record<string, unknown>,
  }));
  return [
    ...tools,
    {
      name: ANSWER_TOOL,
      description: 'Give your final answer. Call it once, when you are done; the loop ends with it.',
      inputSchema: z.toJSONSchema(step.answer, { io: 'input' }) as Record<string, unknown>,
    },
  ];
}

/**
 * The step's identity (what shapes its turns' answers): the model and the framing, the instructions' words, the
 * tools as the model is told of them, the token limit, and offline the planner's source.
 */
function agentIdentity(step: AnyAgentStep, own: object, deps: ModelStepDependencies): string {
  const parts = {
    model: deps.model.info,
    framing: deps.model.promptVersion,
    instructions: step.instructions(own),
    tools: toolSpecs(step),
    maxOutputTokens: step.maxOutputTokens,
    offline: deps.model.info.provider === 'offline' ? step.plan.toString() : undefined,
  };
  return createHash('sha256').update(JSON.stringify(parts)).digest('hex').slice(0, 16);
}

/**
 * A turn of an agent step: read the conversation after the previous turn by reference, add the previous turn's
 * tool outputs, compact it past COMPACT_PAST_CHARS, save it as it is sent, ask the model once through the memo
 * (keyed by the step's identity, the run and the turn: a turn is paid once whatever crashes), save the
 * conversation with the answer, and return references, the tool calls and small outcomes.
 */
export function agentTurnActivity(step: AnyAgentStep, deps: AgentStepDependencies) {
  const activity = async (input: AgentTurnInput): Promise<AgentTurnResult> => {
    const checkpoints = checkpointsOf(deps, step.name);
    const { info } = Context.current();
    const attemptStarted = Date.now();
    const workflowId = info.workflowExecution?.workflowId ?? info.activityId;
    // The document's workflow: the loop's own is `<document workflow ID>:<step>`.
    const documentWorkflowId = workflowId.endsWith(`:${step.name}`)
      ? workflowId.slice(0, -step.name.length - 1)
      : workflowId;
    const base = `${input.keyRunId}:${step.name}`;
    const key = `${base}:turn-${input.turn}`;
    const model = deps.model;
    if (!takesAgentTurns(model))
      throw ApplicationFailure.create({
        type: FailureType.ModelRejected,
        nonRetryable: true,
        message: `model ${model.info.provider}/${model.info.model} takes no agent turns (tool calling): choose another MODEL`,
      });
    const identity = agentIdentity(step, input.own, deps);
    const { messages, compacted } = compact(await conversationFor(step, deps, checkpoints, input));
    await checkpoints.put(`${key}:sent`, documentWorkflowId, step.name, messages);
    const chars = JSON.stringify(messages).length;
    const requestHash = createHash('sha256')
      .update(canonicalJson({ step: step.name, identity, keyRunId: input.keyRunId, turn: input.turn }))
      .digest('hex');
    const memoRequest = {
      memoKey: memoKeyFor(documentWorkflowId, `${step.name}:turn-${input.turn}`, requestHash),
      workflowId: documentWorkflowId,
      runId: input.keyRunId,
      step: `${step.name}:turn-${input.turn}`,
      requestHash,
      identity,
    };
    const request: AgentTurnRequest = {
      step: step.name,
      system: SYSTEM,
      messages,
      tools: toolSpecs(step),
      maxOutputTokens: step.maxOutputTokens,
      offline: { ...definitionModule(step as never), input: input.own },
    };
    const pacing = {
      step: step.name,
      workflowId,
      budget: input.budget,
      // A refusal ends the loop (src/workflow/agent.ts), not a wait for a raise: the message says so.
      onBudgetRefused: 'ends-loop' as const,
      ...deadlinesOf(info, attemptStarted),
    };
    const paid = new PaidCalls(deps, step.name, key);
    const answer = await inSpan(
      'agent turn',
      {
        'pipeline.step': step.name,
        'pipeline.agent.turn': input.turn,
        'pipeline.idempotency_key': key,
        'gen_ai.operation.name': 'chat',
        'gen_ai.provider.name': model.info.provider,
        'gen_ai.request.model': model.info.model,
      },
      () =>
        withHeartbeats((signal) =>
          memoCallOf(deps, memoRequest, AgentReplySchema, `attempt-${info.attempt}`, signal).answer(() =>
            paid.call(() =>
              model.converse(request, {
                idempotencyKey: key,
                signal: callSignal(signal, attemptStarted),
                pacing,
              }),
            ),
          ),
        ),
    );
    const reply = answer.value;
    const answered: AgentMessage = { role: 'assistant', text: reply.text, toolCalls: reply.toolCalls };
    const ref = await checkpoints.put(key, documentWorkflowId, step.name, [...messages, answered]);
    const final = reply.toolCalls.find((c) => c.tool === ANSWER_TOOL);
    const fields = final === undefined ? undefined : step.answer.safeParse(final.input);
    return {
      ref,
      ...(fields?.success === true ? { answer: fields.data as Record<string, never> } : {}),
      // A valid answer ends the loop; every other call (an answer that does not fit among them) is run.
      toolCalls: fields?.success === true ? [] : reply.toolCalls,
      usage: answer.usage,
      estimatedCostUsd: answer.estimatedCostUsd,
      memoised: answer.memoised,
      model: answer.model,
      identity,
      idempotencyKey: key,
      chars,
      compacted,
    };
  };
  Object.defineProperty(activity, 'name', { value: step.name });
  return activity;
}

/** The conversation to send: the first turn's task, or the previous turn's conversation and its tools' outputs. */
async function conversationFor(
  step: AnyAgentStep,
  deps: AgentStepDependencies,
  checkpoints: SqlAgentCheckpoints,
  input: AgentTurnInput,
): Promise<AgentMessage[]> {
  if (input.previousRef === undefined) {
    const text = await deps.texts.read(input.textRef);
    return [{ role: 'user', text: `${documentBlock(text)}\n\n${step.instructions(input.own)}` }];
  }
  const previous = await checkpoints.get(input.previousRef);
  if (previous === undefined)
    throw ApplicationFailure.create({
      type: FailureType.InvalidInput,
      nonRetryable: true,
      message: `agent step ${step.name}: checkpoint ${input.previousRef} is missing from the store (swept?); submit the document again`,
    });
  const messages = MessagesSchema.parse(previous) as unknown as AgentMessage[];
  if (input.toolResults.length === 0) return messages;
  const results = [];
  for (const call of input.toolResults) {
    const stored = ToolOutputSchema.parse(await checkpoints.get(call.ref));
    results.push({ callId: call.callId, tool: call.tool, output: stored.output, isError: stored.isError });
  }
  return [...messages, { role: 'tool', results }];
}

/** The conversation cut below COMPACT_PAST_CHARS where it can be: older tools' outputs become notes of their size. */
export function compact(messages: AgentMessage[]): { messages: AgentMessage[]; compacted: boolean } {
  if (JSON.stringify(messages).length <= COMPACT_PAST_CHARS) return { messages, compacted: false };
  const toolIndexes = messages.flatMap((m, i) => (m.role === 'tool' ? [i] : []));
  const older = new Set(toolIndexes.slice(0, Math.max(0, toolIndexes.length - KEEP_RECENT_TOOL_MESSAGES)));
  const cut = messages.map((m, i): AgentMessage => {
    if (m.role !== 'tool' || !older.has(i)) return m;
    return {
      role: 'tool',
      results: m.results.map((r) => ({
        ...r,
        output: `[compacted: ${JSON.stringify(r.output).length} characters of output left out]`,
      })),
    };
  });
  return { messages: cut, compacted: true };
}

/**
 * A tool call of an agent step, its own activity (ID `<step>:call-<n>`, key `<runId>:<step>:call-<n>`). A call
 * whose output is checkpointed is never run again (its completion was lost: the worker died after it); a tool
 * that changes something gets the key, which its receiver dedupes on, for the crash between its effect and the
 * checkpoint. A model's bad call (an unknown tool, an input that does not fit) is an error output the model reads
 * next turn, not a failure.
 */
export function agentToolActivity(step: AnyAgentStep, deps: AgentStepDependencies) {
  const manifests = new ManifestReader(deps.blobs);
  const activity = async (input: AgentToolInput): Promise<AgentToolCallRecord> => {
    const checkpoints = checkpointsOf(deps, step.name);
    const { info } = Context.current();
    const key = idempotencyKey(info, input.keyRunId);
    const workflowId = info.workflowExecution?.workflowId ?? info.activityId;
    const record = (isError: boolean): AgentToolCallRecord => ({
      n: input.n,
      tool: input.tool,
      outcome: isError ? 'error' : 'ok',
      ref: key,
    });
    const done = ToolOutputSchema.safeParse(await checkpoints.get(key));
    if (done.success) {
      log.info('Tool call done before (its completion was lost): not run again', { key, tool: input.tool });
      return record(done.data.isError);
    }
    const tool = input.tool === ANSWER_TOOL ? undefined : step.tools[input.tool];
    const context: Omit<AgentToolContext, 'signal'> = {
      idempotencyKey: key,
      documentId: input.documentId,
      textRef: input.textRef,
      corpus: async (): Promise<CorpusDocument[]> =>
        input.corpusRef === undefined
          ? []
          : (await manifests.range(input.corpusRef, 0, 100_000)).map(({ documentId, title, textRef }) => ({
              documentId,
              title,
              textRef,
            })),
      read: (textRef) => deps.texts.read(textRef),
      toolUrl: deps.agentToolUrl,
    };
    const outcome = await inSpan(
      'agent tool call',
      {
        'pipeline.step': step.name,
        'pipeline.idempotency_key': key,
        'gen_ai.operation.name': 'execute_tool',
        'gen_ai.tool.name': input.tool,
        'gen_ai.tool.call.id': input.callId,
      },
      async () => {
        if (input.tool === ANSWER_TOOL) {
          const fits = step.answer.safeParse(input.input);
          const why = fits.success ? 'it came with other calls' : describeIssues(fits.error);
          return { output: `the answer was not taken (${why}); call ${ANSWER_TOOL} again`, isError: true };
        }
        if (tool === undefined) {
          const known = [...Object.keys(step.tools), ANSWER_TOOL].join(', ');
          return { output: `no tool is called "${input.tool}"; the tools are ${known}`, isError: true };
        }
        const parsed = tool.input.safeParse(input.input);
        if (!parsed.success) {
          return {
            output: `the input of ${input.tool} does not fit its schema: ${describeIssues(parsed.error)}`,
            isError: true,
          };
        }
        const output: unknown = await withHeartbeats((signal) =>
          tool.run(parsed.data, { ...context, signal }),
        );
        return { output: tool.output.parse(output), isError: false };
      },
    );
    // An answer that did not fit comes here as a call of the answer tool: its error is the model's to read.
    await checkpoints.put(key, workflowId, step.name, outcome);
    return record(outcome.isError);
  };
  Object.defineProperty(activity, 'name', { value: `${step.name}.tool` });
  return activity;
}

/** The name the tool activity of `step` is registered under. */
export function agentToolActivityName(step: string): string {
  return `${step}.tool`;
}
