import { anthropic } from './provider-anthropic';
import { ollama } from './provider-ollama';
import { openai } from './provider-openai';
import { openaiCompatible } from './provider-openai-compatible';
import type { ModelProvider } from './provider';

export type { ModelProvider, ModelVariable, ProviderSettings } from './provider';

/** Every provider MODEL can name. */
export const MODEL_PROVIDERS: readonly ModelProvider[] = [openai, anthropic, ollama, openaiCompatible];

/** The provider called `name`, or undefined. */
export function findProvider(name: string): ModelProvider | undefined {
  return MODEL_PROVIDERS.find((p) => p.name === name);
}
