import { setTimeout as sleep } from 'node:timers/promises';
import { countTokens, extractiveSummary, keywordTags } from './offline-nlp';
import type { DocumentModel, ModelAnswer, ModelCall } from './types';

/**
 * The embedded default while MODEL names no provider: an extractive summary and keyword tags computed from the
 * text with wink-nlp. Deterministic and free; results are labelled provider "offline". An optional latency
 * stands in for a remote model's, so a demo or a chaos test can kill a worker in the middle of a "call".
 */
export class OfflineModel implements DocumentModel {
  readonly info = { provider: 'offline', model: 'extractive-wink-nlp' } as const;
  /** offline-2: tags are always words (offline-1 could store a null tag for the word `constructor`). */
  readonly promptVersion = 'offline-2';

  constructor(private readonly latencyMs = 0) {}

  async summarize(text: string, maxSentences: number, call?: ModelCall): Promise<ModelAnswer<string>> {
    await this.wait(call?.signal);
    const summary = extractiveSummary(text, maxSentences);
    return { value: summary, usage: { inputTokens: countTokens(text), outputTokens: countTokens(summary) } };
  }

  async tag(text: string, maxTags: number, call?: ModelCall): Promise<ModelAnswer<string[]>> {
    await this.wait(call?.signal);
    const tags = keywordTags(text, maxTags);
    return { value: tags, usage: { inputTokens: countTokens(text), outputTokens: tags.length } };
  }

  private async wait(signal: AbortSignal | undefined): Promise<void> {
    if (this.latencyMs === 0) return;
    await sleep(this.latencyMs, undefined, { signal });
  }
}
