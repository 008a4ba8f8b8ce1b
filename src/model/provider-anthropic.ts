import { createAnthropic } from '@ai-sdk/anthropic';
import type { ModelProvider } from './provider';

/** Anthropic's Messages API: `MODEL=anthropic:claude-haiku-4-5`. */
export const anthropic: ModelProvider = {
  name: 'anthropic',
  example: 'claude-haiku-4-5',
  baseUrl: { variable: 'ANTHROPIC_BASE_URL', default: 'https://api.anthropic.com/v1' },
  apiKey: { variable: 'ANTHROPIC_API_KEY', required: true },
  marksPromptCache: true,
  languageModel: ({ model, baseUrl, apiKey }) => createAnthropic({ baseURL: baseUrl, apiKey })(model),
};
