import { countTokens, extractiveSummary, keywordTags } from './offline-nlp';
import type { DocumentModel, ModelAnswer } from './types';

/**
 * The embedded default when no OPENAI_BASE_URL is set: an extractive summary and keyword tags computed from the
 * text with wink-nlp. Deterministic and free; results are labelled provider "offline".
 */
export class OfflineModel implements DocumentModel {
  readonly info = { provider: 'offline', model: 'extractive-wink-nlp' } as const;

  summarize(text: string, maxSentences: number): Promise<ModelAnswer<string>> {
    const summary = extractiveSummary(text, maxSentences);
    return Promise.resolve({
      value: summary,
      usage: { inputTokens: countTokens(text), outputTokens: countTokens(summary) },
    });
  }

  tag(text: string, maxTags: number): Promise<ModelAnswer<string[]>> {
    const tags = keywordTags(text, maxTags);
    return Promise.resolve({
      value: tags,
      usage: { inputTokens: countTokens(text), outputTokens: tags.length },
    });
  }
}
