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
  /** This attempt's start-to-close deadline and the step's schedule-to-close one, on this worker's clock. */
  attemptEndsAt: number;
  stepEndsAt: number;
}

export interface ModelAnswer<T> {
  value: T;
  usage: Usage;
}

/** The two model-backed operations of the pipeline. Implementations: offline (embedded) and AiSdkModel (ai-sdk.ts). */
export interface DocumentModel {
  readonly info: ModelInfo;
  /** Changes whenever the prompts or the answer's shape change, so memoised answers to old prompts stop matching. */
  readonly promptVersion: string;
  summarize(text: string, maxSentences: number, call: ModelCall): Promise<ModelAnswer<string>>;
  tag(text: string, maxTags: number, call: ModelCall): Promise<ModelAnswer<string[]>>;
}
