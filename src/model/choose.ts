import { findProvider, MODEL_PROVIDERS } from './providers';
import type { ModelProvider, ModelVariable } from './providers';

/** A model behind a provider's API, as configured: which one, where, and the variables that said so. */
export interface RemoteModelSettings {
  kind: 'remote';
  /** A name in MODEL_PROVIDERS. */
  provider: string;
  model: string;
  baseUrl: string;
  apiKey: string | undefined;
  /** The variables a person fixes when the provider refuses the model, the address or the key. */
  variables: { model: 'MODEL' | 'OPENAI_MODEL'; baseUrl: ModelVariable; apiKey: ModelVariable };
}

export type ModelSettings = { kind: 'offline' } | RemoteModelSettings;

/** The environment's model variables, trimmed, unset when empty. */
export type ModelEnvironment = { MODEL?: string | undefined; OPENAI_MODEL?: string | undefined } & {
  [V in ModelVariable]?: string | undefined;
};

/**
 * The model MODEL names (`offline`, or `<provider>:<model>`, split at the first colon so `ollama:llama3.1:8b`
 * works), or the older OPENAI_BASE_URL + OPENAI_MODEL pair; the offline model when neither is set. Returns what
 * is wrong, worded for the person who set it, instead of settings that cannot work.
 */
export function chooseModel(env: ModelEnvironment): ModelSettings | { problem: string } {
  if (env.MODEL === undefined) return legacyChoice(env);
  if (env.MODEL === 'offline') return { kind: 'offline' };
  if (env.OPENAI_MODEL !== undefined) {
    return {
      problem: `MODEL and OPENAI_MODEL are both set: keep MODEL (e.g. MODEL=openai:${env.OPENAI_MODEL})`,
    };
  }
  const colon = env.MODEL.indexOf(':');
  const name = colon < 0 ? env.MODEL : env.MODEL.slice(0, colon);
  const model = colon < 0 ? '' : env.MODEL.slice(colon + 1).trim();
  const provider = findProvider(name.trim());
  if (provider === undefined || model === '') {
    const examples = MODEL_PROVIDERS.map((p) => `${p.name}:${p.example}`).join(', ');
    return {
      problem:
        `MODEL must be "offline" or "<provider>:<model>", one of ${examples}` +
        (provider === undefined && colon >= 0 ? ` ("${name}" is no provider)` : ''),
    };
  }
  return settingsFor(provider, model, 'MODEL', env);
}

/** OPENAI_BASE_URL + OPENAI_MODEL without MODEL: an OpenAI-compatible server, as before MODEL existed. */
function legacyChoice(env: ModelEnvironment): ModelSettings | { problem: string } {
  if (
    env.OPENAI_BASE_URL === undefined &&
    (env.OPENAI_MODEL !== undefined || env.OPENAI_API_KEY !== undefined)
  ) {
    return {
      problem:
        'OPENAI_MODEL or OPENAI_API_KEY is set but neither MODEL nor OPENAI_BASE_URL is: set OPENAI_BASE_URL ' +
        '(e.g. http://localhost:11434/v1) with OPENAI_MODEL, or MODEL (e.g. MODEL=openai:gpt-4o-mini), or unset ' +
        'both to use the offline model',
    };
  }
  if (env.OPENAI_BASE_URL === undefined) return { kind: 'offline' };
  if (env.OPENAI_MODEL === undefined) {
    return {
      problem:
        'OPENAI_BASE_URL is set but OPENAI_MODEL is not: name the model, e.g. OPENAI_MODEL=gpt-4o-mini, ' +
        'or set MODEL=openai-compatible:<model>',
    };
  }
  const provider = findProvider('openai-compatible');
  if (provider === undefined)
    return { problem: 'the openai-compatible provider is missing from MODEL_PROVIDERS' };
  return settingsFor(provider, env.OPENAI_MODEL, 'OPENAI_MODEL', env);
}

function settingsFor(
  provider: ModelProvider,
  model: string,
  modelVariable: 'MODEL' | 'OPENAI_MODEL',
  env: ModelEnvironment,
): RemoteModelSettings | { problem: string } {
  const baseUrl = env[provider.baseUrl.variable] ?? provider.baseUrl.default;
  if (baseUrl === undefined) {
    return {
      problem: `${modelVariable}=${provider.name}:${model} needs ${provider.baseUrl.variable}: set it`,
    };
  }
  const apiKey = env[provider.apiKey.variable];
  if (provider.apiKey.required && apiKey === undefined) {
    return {
      problem: `${modelVariable}=${provider.name}:${model} needs an API key: set ${provider.apiKey.variable}`,
    };
  }
  return remoteModel(provider, { model, baseUrl, apiKey }, modelVariable);
}

/** Settings for `model` of `provider` at `baseUrl`, as if MODEL had named it. */
export function remoteModel(
  provider: ModelProvider,
  { model, baseUrl, apiKey }: { model: string; baseUrl: string; apiKey: string | undefined },
  modelVariable: 'MODEL' | 'OPENAI_MODEL' = 'MODEL',
): RemoteModelSettings {
  return {
    kind: 'remote',
    provider: provider.name,
    model,
    baseUrl,
    apiKey,
    variables: { model: modelVariable, baseUrl: provider.baseUrl.variable, apiKey: provider.apiKey.variable },
  };
}

/** Which model the settings name, as results record it (`provider` and `model`); the offline one has no choice. */
export function modelInfoOf(settings: ModelSettings): { provider: string; model: string } {
  return settings.kind === 'offline'
    ? { provider: 'offline', model: 'extractive-wink-nlp' }
    : { provider: settings.provider, model: settings.model };
}
