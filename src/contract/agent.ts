/**
 * The contract of an agent step (src/steps/agent.ts, docs/agent.md): the run's setting that turns agent steps on,
 * what its loop carries from turn to turn, and how it ended. Plain values and types, no schema library: the loop's
 * workflow reads them in the sandbox. Schemas, for the worker's checks, are in ./index.ts.
 */

/** Why an agent loop ended: the model answered, or a limit ended it (a clear outcome, never a failed run). */
export const AGENT_OUTCOMES = [
  'answered',
  'turn-limit',
  'token-limit',
  'cost-limit',
  'budget',
  'no-answer',
] as const;
export type AgentOutcome = (typeof AGENT_OUTCOMES)[number];

/** Bounds of AgentSettings' numbers (AgentSettingsSchema checks them). */
export const AGENT_LIMITS = {
  maxTurns: { min: 1, max: 100, default: 8 },
  maxTokens: { min: 100, max: 10_000_000, default: 200_000 },
  historyEvents: { min: 20, max: 40_000, default: 2_000 },
} as const;

/**
 * A run's agent steps are on when its input carries this (AGENT=on; npm start leaves it out by default). The
 * limits end the loop with an outcome; the run's budget and the fleet's pacing apply to every turn besides.
 */
export interface AgentSettings {
  /** Model turns the loop may take. */
  maxTurns: number;
  /** Input and output tokens the loop's turns may use together. */
  maxTokens: number;
  /** US dollars the loop's turns may cost together; unset: only the run's budget limits them. */
  maxCostUsd?: number;
  /**
   * Events of the loop's history past which it continues as new (well before Temporal's 51,200-event limit and its
   * 10,240-event warning); what it carries is references and counts.
   */
  historyEvents: number;
  /** The batch's manifest: the other documents an agent's tools may look into. Absent for a run of its own. */
  corpusRef?: string;
}

/** One tool call of a loop, as its history and the result keep it: small, never the tool's output itself. */
export interface AgentToolCallRecord {
  /** The call's number in the loop (1, 2, ...): its key is `<runId>:<step>:call-<n>`. */
  n: number;
  tool: string;
  outcome: 'ok' | 'error';
  /** Where the tool's output is, in the conversation store. */
  ref: string;
}

/** What an agent step's result says of its loop: how it ended, its turns and tool calls, continues as new. */
export interface AgentSummary {
  outcome: AgentOutcome;
  turns: number;
  toolCalls: AgentToolCallRecord[];
  /** Times the loop continued as new (its history passed historyEvents). */
  continuedAsNew: number;
  /** Turns whose answer came from the memo (paid by an earlier attempt). */
  memoisedTurns: number;
}
