import type { ModelInfo, Usage } from '../contract';

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
