/**
 * A model provider that bills, for the budget tests: the demo's model server (demo/model-server.ts) answering both
 * APIs, counting a request's tokens the way a provider's tokenizer would at its densest, and keeping a log of what
 * it billed, whatever became of the answer (a client that timed out or was killed is billed all the same: the
 * provider served the request). Its prices are the providers' list prices, written here apart from the project's
 * table (src/model/pricing.ts), so a test compares the project's accounting with an invoice.
 *
 * - Tokens: a quarter token an ASCII character, and two tokens a character of a CJK script (OpenAI's cl100k_base
 *   and o200k_base spend one to three on a Chinese character, splitting rarer ones into their bytes: two a
 *   character on running text is denser than either), one a character of any other script of the BMP, and a
 *   token a byte beyond it (rare ideographs of CJK Extension B and on, emoji: the byte fallback); rounded up.
 * - Framing, as the APIs add it: chat completions 3 tokens a message and 3 to prime the answer, and the JSON of
 *   `tools` and `response_format`; Messages the JSON of `tools` and `output_format`, and the tool-use system prompt
 *   of 346 tokens when the request forces a tool (Anthropic's documented figure for its Claude 4 models).
 * - Anthropic's prompt cache (docs.anthropic.com, prompt caching): the prompt up to and including the last block
 *   marked `cache_control` is the cached prefix when it is at least the model's minimum (1,024 tokens; 4,096 for
 *   Claude Haiku 4.5); the first request with it is
 *   billed a cache write of those tokens (`cache_creation_input_tokens`, 1.25x the input price), a request within
 *   5 minutes a cache read (`cache_read_input_tokens`, 0.1x); `input_tokens` is the rest.
 */
import {
  answerBody,
  errorReply,
  invalidRequest,
  parsedRequest,
  startModelServer,
} from '../demo/model-server';
import type { ChatApi, ChatRequest, ModelServer } from '../demo/model-server';

/** List prices, US dollars a million tokens. */
const LIST_PRICES: Record<string, { input: number; cacheWrite: number; cacheRead: number; output: number }> =
  {
    'gpt-4o-mini': { input: 0.15, cacheWrite: 0.15, cacheRead: 0.075, output: 0.6 },
    'claude-haiku-4-5': { input: 1, cacheWrite: 1.25, cacheRead: 0.1, output: 5 },
  };

/** One request billed. */
export interface Bill {
  api: ChatApi;
  idempotencyKey: string | undefined;
  /** Every input token, cache writes and reads included. */
  inputTokens: number;
  cacheWriteTokens: number;
  cacheReadTokens: number;
  outputTokens: number;
  usd: number;
  /** The request as the server saw it: `cutOff` once its client went away before the answer. */
  request: ChatRequest;
}

export interface BillingProvider {
  /** For OPENAI_BASE_URL or ANTHROPIC_BASE_URL. */
  baseUrl: string;
  server: ModelServer;
  bills: Bill[];
  /** Tokens billed in all: input (written, read and plain) and output. */
  billedTokens(): number;
  billedUsd(): number;
  close(): Promise<void>;
}

const TOOL_USE_SYSTEM_PROMPT_TOKENS = 346;
const CACHE_MIN_TOKENS: Record<string, number> = { 'claude-haiku-4-5': 4_096 };
const CACHE_TTL_MS = 5 * 60_000;

/** Tokens of `text`, counted at least as densely as the providers' tokenizers (see the file's comment). */
export function billedTokens(text: string): number {
  let quarterTokens = 0;
  for (const ch of text) {
    const code = ch.codePointAt(0) ?? 0;
    // Beyond the BMP (ideographs of Extension B and on, emoji) a tokenizer falls back to bytes: 4 tokens.
    quarterTokens += code < 0x80 ? 1 : code >= 0x10000 ? 16 : isCjk(code) ? 8 : 4;
  }
  return Math.ceil(quarterTokens / 4);
}

function isCjk(code: number): boolean {
  return (
    (code >= 0x2e80 && code <= 0x9fff) || // radicals, punctuation, kana, Hangul letters, CJK ideographs
    (code >= 0xac00 && code <= 0xd7af) || // Hangul syllables
    (code >= 0xf900 && code <= 0xfaff) || // compatibility ideographs
    (code >= 0xff00 && code <= 0xffef) // full-width forms
  );
}

interface Block {
  text: string;
  marked: boolean;
}

/** The prompt's text blocks in the order the model reads them, each with whether it is marked for the cache. */
function blocksOf(request: ChatRequest): Block[] {
  const body = request.body as {
    system?: unknown;
    messages?: { role: string; content: unknown }[];
  };
  const blocks: Block[] = [];
  const add = (content: unknown): void => {
    if (typeof content === 'string') blocks.push({ text: content, marked: false });
    else if (Array.isArray(content))
      for (const part of content as { type?: string; text?: string; cache_control?: unknown }[])
        if (part.type === 'text')
          blocks.push({ text: part.text ?? '', marked: part.cache_control !== undefined });
  };
  add(body.system);
  for (const message of body.messages ?? []) add(message.content);
  return blocks;
}

/**
 * Starts the provider. `answer` gives the content for a request (free text, or JSON for one that asks for a
 * schema); `delayMs` how long each answer takes (the bill is written as the request is served, at once).
 */
export async function startBillingProvider(
  answer: (request: ChatRequest, wantsJson: boolean) => string,
  delayMs: (n: number, request: ChatRequest) => number = () => 0,
): Promise<BillingProvider> {
  const bills: Bill[] = [];
  const cache = new Map<string, number>();
  const server = await startModelServer((request, n) => {
    const parsed = parsedRequest(request);
    if (parsed === undefined) return invalidRequest(request.api);
    const price = LIST_PRICES[parsed.model];
    if (price === undefined)
      return errorReply(request.api, 404, {
        type: 'not_found_error',
        message: `model: ${parsed.model}`,
      });
    const body = request.body as Record<string, unknown>;
    const blocks = blocksOf(request);
    const now = Date.now();
    let framing = 0;
    let cachedPrefix = 0;
    let cacheKey: string | undefined;
    if (request.api === 'chat') {
      framing = 3 * parsed.messages.length + 3;
      framing += billedTokens(JSON.stringify([body.tools ?? '', body.response_format ?? '']));
    } else {
      framing = billedTokens(JSON.stringify([body.tools ?? '', body.output_format ?? '']));
      if (parsed.forcedTool !== undefined) framing += TOOL_USE_SYSTEM_PROMPT_TOKENS;
      const last = blocks.map((b) => b.marked).lastIndexOf(true);
      if (last >= 0) {
        const prefix = blocks.slice(0, last + 1).map((b) => b.text);
        const tokens = prefix.reduce((sum, text) => sum + billedTokens(text), 0);
        if (tokens >= (CACHE_MIN_TOKENS[parsed.model] ?? 1_024)) {
          cachedPrefix = tokens;
          cacheKey = `${parsed.model}\0${prefix.join('\0')}`;
        }
      }
    }
    const promptTokens = blocks.reduce((sum, b) => sum + billedTokens(b.text), 0) + framing;
    const seen = cacheKey === undefined ? undefined : cache.get(cacheKey);
    const cacheReadTokens = seen !== undefined && now - seen <= CACHE_TTL_MS ? cachedPrefix : 0;
    const cacheWriteTokens = cacheReadTokens === 0 ? cachedPrefix : 0;
    if (cacheKey !== undefined) cache.set(cacheKey, now);
    const content = answer(request, parsed.schema !== undefined);
    const outputTokens = Math.min(parsed.maxTokens ?? Infinity, billedTokens(content));
    const plain = promptTokens - cacheReadTokens - cacheWriteTokens;
    bills.push({
      api: request.api,
      idempotencyKey: request.idempotencyKey,
      inputTokens: promptTokens,
      cacheWriteTokens,
      cacheReadTokens,
      outputTokens,
      usd:
        (plain * price.input +
          cacheWriteTokens * price.cacheWrite +
          cacheReadTokens * price.cacheRead +
          outputTokens * price.output) /
        1e6,
      request,
    });
    return {
      body: answerBody(request, content, {
        inputTokens: promptTokens,
        outputTokens,
        cachedInputTokens: cacheReadTokens,
        cacheCreationInputTokens: cacheWriteTokens,
      }),
      delayMs: delayMs(n, request),
    };
  });
  return {
    baseUrl: server.baseUrl,
    server,
    bills,
    billedTokens: () => bills.reduce((sum, b) => sum + b.inputTokens + b.outputTokens, 0),
    billedUsd: () => bills.reduce((sum, b) => sum + b.usd, 0),
    close: () => server.close(),
  };
}
