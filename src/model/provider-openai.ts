import { createOpenAI } from '@ai-sdk/openai';
import type { ModelProvider } from './provider';

/** OpenAI itself, through its Responses API (the AI SDK's default for OpenAI models): `MODEL=openai:gpt-4o-mini`. */
export const openai: ModelProvider = {
  name: 'openai',
  example: 'gpt-4o-mini',
  baseUrl: { variable: 'OPENAI_BASE_URL', default: 'https://api.openai.com/v1' },
  apiKey: { variable: 'OPENAI_API_KEY', required: true },
  languageModel: ({ model, baseUrl, apiKey }) => createOpenAI({ baseURL: baseUrl, apiKey }).responses(model),
};
