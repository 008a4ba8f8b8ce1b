import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import type { ModelProvider } from './provider';

/**
 * A local Ollama through its OpenAI-compatible endpoint: `MODEL=ollama:llama3.1`. OPENAI_BASE_URL moves it (in
 * a container, `http://host.docker.internal:11434/v1`).
 */
export const ollama: ModelProvider = {
  name: 'ollama',
  example: 'llama3.1',
  baseUrl: { variable: 'OPENAI_BASE_URL', default: 'http://localhost:11434/v1' },
  apiKey: { variable: 'OPENAI_API_KEY', required: false },
  languageModel: ({ model, baseUrl, apiKey }) =>
    createOpenAICompatible({ name: 'ollama', baseURL: baseUrl, apiKey, supportsStructuredOutputs: true })(
      model,
    ),
};
