import type { LanguageModel } from 'ai';

/** The settings variables a provider may read (each one is in src/config.ts and the README's table). */
export type ModelVariable = 'OPENAI_BASE_URL' | 'OPENAI_API_KEY' | 'ANTHROPIC_BASE_URL' | 'ANTHROPIC_API_KEY';

/** Where one model is and how to reach it: what a provider needs to build its AI SDK model. */
export interface ProviderSettings {
  model: string;
  baseUrl: string;
  apiKey: string | undefined;
}

/**
 * One model provider behind the AI SDK, chosen by `MODEL=<name>:<model>`. Everything else (prompts, structured
 * output, idempotency key, abort signal, error sorting, usage) is shared in ai-sdk.ts, so a provider is one file
 * with one of these, listed in MODEL_PROVIDERS.
 */
export interface ModelProvider {
  /** The part of MODEL before the first colon; also the `provider` recorded with every answer. */
  readonly name: string;
  /** A model name for messages, e.g. `gpt-4o-mini`. */
  readonly example: string;
  /** The variable that says where the API is, and the URL used while it is unset (none: it must be set). */
  readonly baseUrl: { variable: ModelVariable; default?: string };
  /** The variable holding the API key, and whether the provider cannot work without one. */
  readonly apiKey: { variable: ModelVariable; required: boolean };
  /**
   * True when the provider caches a prompt's prefix only up to a block the request marks (Anthropic's
   * `cache_control`): the document then goes as a block of its own, marked. Providers that cache any repeated
   * prefix by themselves (OpenAI, vLLM, llama.cpp) get the document and the step's task as one text, the form
   * every chat-completions server reads.
   */
  readonly marksPromptCache?: boolean;
  /** The AI SDK model. Settings are always given: the SDK must not read the environment itself. */
  languageModel(settings: ProviderSettings): LanguageModel;
}
