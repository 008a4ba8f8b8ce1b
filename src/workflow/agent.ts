import {
  ActivityFailure,
  ApplicationFailure,
  continueAsNew,
  executeChild,
  proxyActivities,
  workflowInfo,
} from '@temporalio/workflow';
import type { ActivityOptions } from '@temporalio/workflow';
import type {
  AgentOutcome,
  AgentSettings,
  AgentSummary,
  AgentToolCallRecord,
  BudgetInput,
  ModelInfo,
  Usage,
} from '../contract/plain';
import { FailureType } from '../contract/plain';
import { modelStepOptions } from './options';
import type { AgentToolResultRef, AgentTurnInput, AgentTurnResult } from '../steps/agent';
import type { AgentToolInput } from '../steps/agent-activities';

/** The loop's workflow type, which the face's workflow module exports (workflows/index.ts). */
export const AGENT_LOOP_WORKFLOW = 'agentLoop';

/** A turn is a model call: as a model step's, its retries are uncapped and its budget is the step's. */
const turnOptions: ActivityOptions = {
  ...modelStepOptions,
  // A turn the run's budget refuses ends the loop with its outcome (the budget), not a wait of its own.
  retry: {
    ...modelStepOptions.retry,
    nonRetryableErrorTypes: [FailureType.PayloadRefused, FailureType.BudgetExhausted],
  },
};

/**
 * A tool call: retried until its budget ends, each retry under the same key (`<runId>:<step>:call-<n>`), so a
 * tool that changes something is deduped by its receiver and never acts twice.
 */
const toolOptions: ActivityOptions = {
  startToCloseTimeout: '1 minute',
  heartbeatTimeout: '10 seconds',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' },
};

/** Where a loop stands: carried across its continues as new (references and counts, never the conversation). */
interface LoopState {
  turn: number;
  calls: number;
  ref?: string | undefined;
  pending: AgentToolResultRef[];
  toolCalls: AgentToolCallRecord[];
  usage: Usage;
  costUsd: number | null;
  memoisedTurns: number;
  continuedAsNew: number;
  model?: ModelInfo | undefined;
  identity?: string | undefined;
}

/** An agent loop's input: the step, the document, the run whose ID keys its calls, the limits, where it stands. */
export interface AgentLoopInput {
  step: string;
  documentId: string;
  textRef: string;
  budget?: BudgetInput | undefined;
  own: object;
  keyRunId: string;
  settings: AgentSettings;
  stepBudgetMinutes: number;
  modelTimeoutSeconds: number;
  state?: LoopState | undefined;
}

/** What a loop returns: the answer's fields (when it answered) and the result's model-step fields and summary. */
export interface AgentLoopResult {
  answer?: Record<string, unknown> | undefined;
  idempotencyKey: string;
  model: ModelInfo;
  usage: Usage;
  memoised: boolean;
  estimatedCostUsd: number | null;
  identity?: string | undefined;
  agent: AgentSummary;
}

/**
 * An agent step's loop, a workflow of its own (a child of the document's run, ID `<document workflow ID>:<step>`),
 * so its turns and calls fill its history, not the document's, and it continues as new past the history size
 * the settings give, carrying references and counts. Each turn is an activity (`<step>:turn-<n>`) that asks the
 * model once; each tool call one (`<step>:call-<n>`). A limit, or the run's budget, ends the loop with an outcome.
 */
export async function agentLoop(input: AgentLoopInput): Promise<AgentLoopResult> {
  const { step, settings } = input;
  const state: LoopState = input.state ?? {
    turn: 0,
    calls: 0,
    pending: [],
    toolCalls: [],
    usage: { inputTokens: 0, outputTokens: 0 },
    costUsd: 0,
    memoisedTurns: 0,
    continuedAsNew: 0,
  };
  const timeouts = {
    scheduleToCloseTimeout: `${input.stepBudgetMinutes} minutes`,
    startToCloseTimeout: `${input.modelTimeoutSeconds} seconds`,
  } as const;
  const end = (outcome: AgentOutcome, answer?: Record<string, unknown>): AgentLoopResult => ({
    ...(answer === undefined ? {} : { answer }),
    idempotencyKey: `${input.keyRunId}:${step}`,
    model: state.model ?? { provider: 'none', model: 'no turn answered' },
    usage: state.usage,
    memoised: state.turn > 0 && state.memoisedTurns === state.turn,
    estimatedCostUsd: state.costUsd,
    ...(state.identity === undefined ? {} : { identity: state.identity }),
    agent: {
      outcome,
      turns: state.turn,
      toolCalls: state.toolCalls,
      continuedAsNew: state.continuedAsNew,
      memoisedTurns: state.memoisedTurns,
    },
  });
  for (;;) {
    if (state.turn >= settings.maxTurns) return end('turn-limit');
    const tokens = state.usage.inputTokens + state.usage.outputTokens;
    if (tokens >= settings.maxTokens) return end('token-limit');
    if (settings.maxCostUsd !== undefined && state.costUsd !== null && state.costUsd >= settings.maxCostUsd)
      return end('cost-limit');
    // Well before Temporal's limits: the next run starts from the references, with a history of its own.
    if (workflowInfo().historyLength >= settings.historyEvents || workflowInfo().continueAsNewSuggested)
      await continueAsNew<typeof agentLoop>({
        ...input,
        state: { ...state, continuedAsNew: state.continuedAsNew + 1 },
      });
    state.turn++;
    const turnActivity = proxyActivities<Record<string, (i: AgentTurnInput) => Promise<AgentTurnResult>>>({
      ...turnOptions,
      ...timeouts,
      activityId: `${step}:turn-${state.turn}`,
    })[step];
    if (turnActivity === undefined) throw new Error(`no activity ${step}`);
    let result: AgentTurnResult;
    try {
      result = await turnActivity({
        documentId: input.documentId,
        textRef: input.textRef,
        ...(input.budget === undefined ? {} : { budget: input.budget }),
        own: input.own,
        keyRunId: input.keyRunId,
        turn: state.turn,
        ...(state.ref === undefined ? {} : { previousRef: state.ref }),
        toolResults: state.pending,
      });
    } catch (err) {
      // Nothing was paid past the run's budget: the loop ends, and says so.
      if (failedWith(err, FailureType.BudgetExhausted)) {
        state.turn--;
        return end('budget');
      }
      throw err;
    }
    state.ref = result.ref;
    state.pending = [];
    state.usage = addUsage(state.usage, result.usage);
    state.costUsd =
      state.costUsd === null || result.estimatedCostUsd === null
        ? null
        : state.costUsd + result.estimatedCostUsd;
    if (result.memoised) state.memoisedTurns++;
    state.model = result.model;
    state.identity = result.identity;
    if (result.answer !== undefined) return end('answered', result.answer);
    if (result.toolCalls.length === 0) return end('no-answer');
    for (const call of result.toolCalls) {
      state.calls++;
      const toolActivity = proxyActivities<
        Record<string, (i: AgentToolInput) => Promise<AgentToolCallRecord>>
      >({
        ...toolOptions,
        scheduleToCloseTimeout: timeouts.scheduleToCloseTimeout,
        activityId: `${step}:call-${state.calls}`,
      })[`${step}.tool`];
      if (toolActivity === undefined) throw new Error(`no activity ${step}.tool`);
      const record = await toolActivity({
        documentId: input.documentId,
        textRef: input.textRef,
        keyRunId: input.keyRunId,
        n: state.calls,
        callId: call.callId,
        tool: call.tool,
        input: call.input,
        ...(settings.corpusRef === undefined ? {} : { corpusRef: settings.corpusRef }),
      });
      state.toolCalls.push(record);
      state.pending.push({ callId: call.callId, tool: call.tool, ref: record.ref });
    }
  }
}

/**
 * Runs an agent step's loop as a child of the document's run, when the run's input turns agent steps on; returns
 * its result (the answer's fields, the loop's summary), or undefined when agent steps are off.
 */
export async function runAgentStep(
  step: string,
  own: object,
  run: {
    documentId: string;
    textRef: string;
    budget?: BudgetInput | undefined;
    agent?: AgentSettings | undefined;
    options: { stepBudgetMinutes: number; modelTimeoutSeconds: number };
  },
): Promise<Record<string, unknown> | undefined> {
  if (run.agent === undefined) return undefined;
  const info = workflowInfo();
  const loop = await executeChild<typeof agentLoop>(AGENT_LOOP_WORKFLOW, {
    workflowId: `${info.workflowId}:${step}`,
    args: [
      {
        step,
        documentId: run.documentId,
        textRef: run.textRef,
        ...(run.budget === undefined ? {} : { budget: run.budget }),
        own,
        keyRunId: info.runId,
        settings: run.agent,
        stepBudgetMinutes: run.options.stepBudgetMinutes,
        modelTimeoutSeconds: run.options.modelTimeoutSeconds,
      },
    ],
  });
  const { answer, ...fields } = loop;
  return { ...answer, ...fields };
}

function failedWith(err: unknown, type: string): boolean {
  return err instanceof ActivityFailure && err.cause instanceof ApplicationFailure && err.cause.type === type;
}

function addUsage(a: Usage, b: Usage): Usage {
  return { inputTokens: a.inputTokens + b.inputTokens, outputTokens: a.outputTokens + b.outputTokens };
}
