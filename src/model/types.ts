import type { ModelInfo, Usage } from '../contract';

export interface ModelCall {
  /** `<runId>:<activityId>`: sent as the Idempotency-Key header so a provider that dedupes can do so. */
  idempotencyKey: string;
  /** Aborts the request when the activity is cancelled or times out. */
  signal: AbortSignal;
}

export interface ModelAnswer<T> {
  value: T;
  usage: Usage;
}

/** The two model-backed operations of the pipeline. Implementations: offline (embedded) and OpenAI-compatible. */
export interface DocumentModel {
  readonly info: ModelInfo;
  summarize(text: string, maxSentences: number, call: ModelCall): Promise<ModelAnswer<string>>;
  tag(text: string, maxTags: number, call: ModelCall): Promise<ModelAnswer<string[]>>;
}
