import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import type { ModelProvider } from './provider';

/**
 * Any server speaking OpenAI's chat completions (vLLM, LM Studio, llama.cpp, a gateway):
 * `MODEL=openai-compatible:<model>` with OPENAI_BASE_URL. Also what OPENAI_BASE_URL + OPENAI_MODEL choose.
 */
export const openaiCompatible: ModelProvider = {
  name: 'openai-compatible',
  example: 'qwen2.5-7b-instruct',
  baseUrl: { variable: 'OPENAI_BASE_URL' },
  apiKey: { variable: 'OPENAI_API_KEY', required: false },
  languageModel: ({ model, baseUrl, apiKey }) =>
    // Structured outputs: the tag schema goes out as response_format json_schema, which these servers enforce.
    createOpenAICompatible({
      name: 'openai-compatible',
      baseURL: baseUrl,
      apiKey,
      supportsStructuredOutputs: true,
    })(model),
};
