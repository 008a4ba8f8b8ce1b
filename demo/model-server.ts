/**
 * A stand-in for a paid model: a server on loopback that speaks OpenAI's chat completions
 * (`POST /v1/chat/completions`) and Anthropic's Messages API (`POST /v1/messages`). It logs every request with its
 * idempotency key and its fate (answered with a status, cut off when the caller went away), so the demo and the
 * tests count the model calls really made, from outside the worker they kill. A script decides each answer: the
 * demo's is slow and sensible (text, or JSON that fits the schema the request sends, whichever step asks), the
 * tests' inject 429s, 500s, hangs and junk, test/provider-limits.ts enforces a provider's rate limits.
 */
import http from 'node:http';
import { z } from 'zod';
import { closeServer, listenOnLoopback } from '../src/lib/loopback';
import { demoAnswer } from './demo-answer';

/** Which API a request called: OpenAI's chat completions, or Anthropic's Messages. */
export type ChatApi = 'chat' | 'messages';

/** One request that reached the server. */
export interface ChatRequest {
  api: ChatApi;
  /** The `idempotency-key` header, `<run ID>:<step>`; undefined when none was sent. */
  idempotencyKey: string | undefined;
  /** The credential as sent: the Authorization header (chat completions) or x-api-key (Messages). */
  authorization: string | undefined;
  /** The JSON body; undefined when it was not JSON. */
  body: unknown;
  /**
   * The first path segment when the base URL had one (`<origin>/<route>/v1`): a test gives each worker host its
   * own route, to tell whose call it is.
   */
  route: string | undefined;
  /**
   * Which step asked, as the request states it: the `x-pipeline-step` header the pipeline sends on every call;
   * undefined when there is none. The server never guesses it, and answers what the request asks for whatever it
   * says: this is for the scripts and the logs.
   */
  step: string | undefined;
  receivedAt: number;
  /** When the answer was sent; undefined while open, or for a call cut off before it. */
  answeredAt: number | undefined;
  /** The HTTP status of the answer sent; undefined while open, or for a call cut off before it. */
  status: number | undefined;
  /** The caller went away (its worker was killed, its attempt timed out) before the answer was sent. */
  cutOff: boolean;
}

/** How the server answers one request: a status, headers and a body, after an optional delay; or never. */
export type ChatReply =
  { status?: number; headers?: Record<string, string>; body: unknown; delayMs?: number } | 'hang';

export type ChatScript = (request: ChatRequest, n: number) => ChatReply;

export interface ModelServer {
  /**
   * For OPENAI_BASE_URL, with MODEL=openai-compatible:<model> (or OPENAI_MODEL); for ANTHROPIC_BASE_URL, with
   * MODEL=anthropic:<model>.
   */
  baseUrl: string;
  /** Every request received, in order of arrival. */
  requests: ChatRequest[];
  /** The requests held open right now, waiting for their answer. */
  open(): ChatRequest[];
  close(): Promise<void>;
}

/** A chat-completions body with `content`, the way OpenAI-compatible servers answer. */
export function completion(content: string, usage = { prompt_tokens: 100, completion_tokens: 20 }): unknown {
  return { choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }], usage };
}

/** The tokens of an answer, as the API in question reports them. */
export interface AnswerUsage {
  /** Every token of the prompt, cached ones included. */
  inputTokens: number;
  outputTokens: number;
  /** Of inputTokens, those served from the provider's prompt cache. */
  cachedInputTokens?: number;
  /** Of inputTokens, those written to Anthropic's prompt cache (billed above the base price). */
  cacheCreationInputTokens?: number;
}

/**
 * A 2xx body of the request's API with `content`: chat completions' `choices` and `usage` (cached tokens in
 * `prompt_tokens_details`), or a Messages `message` whose `input_tokens` counts only what was neither read from nor
 * written to the cache, as Anthropic reports it. When the request forces a tool call and `content` is a JSON
 * object, the answer is that call (a Messages `tool_use` block, a chat completion's `tool_calls`), as the API
 * sends it; otherwise `content` is the message's text.
 */
export function answerBody(
  request: Pick<ChatRequest, 'api' | 'body'>,
  content: string,
  usage: AnswerUsage,
): unknown {
  const cached = usage.cachedInputTokens ?? 0;
  const created = usage.cacheCreationInputTokens ?? 0;
  const parsed = parsedRequest(request);
  const model = parsed?.model ?? 'stand-in';
  const tool = parsed?.forcedTool;
  const input = tool === undefined ? undefined : jsonObjectOf(content);
  const call = tool === undefined || input === undefined ? undefined : { name: tool, input };
  if (request.api === 'messages') {
    return {
      id: 'msg_stand_in',
      type: 'message',
      role: 'assistant',
      model,
      content:
        call === undefined
          ? [{ type: 'text', text: content }]
          : [{ type: 'tool_use', id: 'toolu_stand_in', name: call.name, input: call.input }],
      stop_reason: call === undefined ? 'end_turn' : 'tool_use',
      stop_sequence: null,
      usage: {
        input_tokens: usage.inputTokens - cached - created,
        output_tokens: usage.outputTokens,
        cache_read_input_tokens: cached,
        cache_creation_input_tokens: created,
      },
    };
  }
  return {
    id: 'chatcmpl-stand-in',
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [
      call === undefined
        ? { index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }
        : {
            index: 0,
            message: {
              role: 'assistant',
              content: null,
              tool_calls: [
                { id: 'call_stand_in', type: 'function', function: { name: call.name, arguments: content } },
              ],
            },
            finish_reason: 'tool_calls',
          },
    ],
    usage: {
      prompt_tokens: usage.inputTokens,
      completion_tokens: usage.outputTokens,
      total_tokens: usage.inputTokens + usage.outputTokens,
      prompt_tokens_details: { cached_tokens: cached },
    },
  };
}

/** `text` parsed, when it is a JSON object. */
function jsonObjectOf(text: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(text);
    const object = z.record(z.string(), z.unknown()).safeParse(value);
    return object.success ? object.data : undefined;
  } catch {
    return undefined;
  }
}

/** An error answer in the API's own shape: OpenAI's `{error: {...}}`, Anthropic's `{type: 'error', error: {...}}`. */
export function errorReply(
  api: ChatApi,
  status: number,
  error: { type: string; message: string; code?: string | null },
  headers: Record<string, string> = {},
): Exclude<ChatReply, 'hang'> {
  const body =
    api === 'messages'
      ? { type: 'error', error: { type: error.type, message: error.message } }
      : { error: { message: error.message, type: error.type, param: null, code: error.code ?? null } };
  return { status, headers, body };
}

/** Each API's path after the base URL's `/v1`. */
const API_PATHS: Record<ChatApi, string> = { chat: '/v1/chat/completions', messages: '/v1/messages' };

/** The API a path asks for, and the route in front of it (`/<route>/v1/...`); undefined for any other path. */
function routeOf(url: string): { api: ChatApi; route: string | undefined } | undefined {
  const pathname = url.split('?')[0] ?? '';
  for (const api of ['chat', 'messages'] as const) {
    if (!pathname.endsWith(API_PATHS[api])) continue;
    const prefix = pathname.slice(0, -API_PATHS[api].length);
    if (prefix === '') return { api, route: undefined };
    if (/^\/[^/]+$/.test(prefix)) return { api, route: prefix.slice(1) };
  }
  return undefined;
}

/**
 * Starts the server on a free loopback port; `script` gets each request (numbered from 1) and returns the answer.
 * Both APIs are served under one base URL, `<origin>/v1`.
 */
export async function startModelServer(script: ChatScript): Promise<ModelServer> {
  const requests: ChatRequest[] = [];
  const held = new Set<http.ServerResponse>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const where = routeOf(req.url ?? '');
      if (req.method !== 'POST' || where === undefined) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(
          JSON.stringify({
            error: { message: 'POST /v1/chat/completions and POST /v1/messages are the only routes' },
          }),
        );
        return;
      }
      const raw = Buffer.concat(chunks).toString('utf8');
      let body: unknown;
      try {
        body = JSON.parse(raw);
      } catch {
        body = undefined;
      }
      const header = (name: string): string | undefined => {
        const value = req.headers[name];
        return typeof value === 'string' ? value : undefined;
      };
      const request: ChatRequest = {
        api: where.api,
        idempotencyKey: header('idempotency-key'),
        authorization: header(where.api === 'messages' ? 'x-api-key' : 'authorization'),
        body,
        route: where.route,
        step: header('x-pipeline-step'),
        receivedAt: Date.now(),
        answeredAt: undefined,
        status: undefined,
        cutOff: false,
      };
      requests.push(request);
      res.on('close', () => {
        held.delete(res);
        if (request.answeredAt === undefined) request.cutOff = true;
      });
      const answer = script(request, requests.length);
      if (answer === 'hang') {
        held.add(res);
        return;
      }
      const send = (): void => {
        if (res.destroyed) return;
        request.answeredAt = Date.now();
        request.status = answer.status ?? 200;
        res.writeHead(request.status, { 'content-type': 'application/json', ...answer.headers });
        res.end(typeof answer.body === 'string' ? answer.body : JSON.stringify(answer.body));
      };
      if (answer.delayMs === undefined) return send();
      held.add(res);
      const timer = setTimeout(send, answer.delayMs);
      res.on('close', () => clearTimeout(timer));
    });
  });
  const origin = await listenOnLoopback(server, 'model server');
  return {
    baseUrl: `${origin}/v1`,
    requests,
    open: () => requests.filter((r) => r.answeredAt === undefined && !r.cutOff),
    close: async () => {
      for (const res of held) res.destroy();
      await closeServer(server);
    },
  };
}

/** A message's content: a string, or content blocks of which the text blocks count. */
const ContentSchema = z.union([
  z.string(),
  z.array(z.object({ type: z.string(), text: z.string().optional() })),
]);

/** Anthropic's structured output: `{type: 'json_schema', schema}`. */
const OutputFormatSchema = z.object({ type: z.string(), schema: z.unknown() });

const ChatBodySchema = z.object({
  model: z.string().optional(),
  messages: z.array(z.object({ role: z.string(), content: ContentSchema.nullish() })).min(1),
  max_tokens: z.number().int().positive().optional(),
  max_completion_tokens: z.number().int().positive().optional(),
  response_format: z
    .object({ type: z.string(), json_schema: z.object({ schema: z.unknown() }).optional() })
    .optional(),
  tools: z
    .array(
      z.object({
        type: z.string(),
        function: z.object({ name: z.string(), parameters: z.unknown() }).optional(),
      }),
    )
    .optional(),
  // 'required' (any tool), or one tool by name: `{type: 'function', function: {name}}`.
  tool_choice: z
    .union([z.string(), z.object({ type: z.string(), function: z.object({ name: z.string() }).optional() })])
    .optional(),
});

const MessagesBodySchema = z.object({
  model: z.string().optional(),
  system: ContentSchema.optional(),
  messages: z.array(z.object({ role: z.string(), content: ContentSchema })).min(1),
  // Anthropic requires it on every request.
  max_tokens: z.number().int().positive(),
  output_config: z.object({ format: OutputFormatSchema.optional() }).optional(),
  // The structured-outputs beta's name for output_config.format.
  output_format: OutputFormatSchema.optional(),
  // Server tools (web search and the like) have no input_schema.
  tools: z.array(z.object({ name: z.string(), input_schema: z.unknown().optional() })).optional(),
  // `{type: 'any'}` (any tool) or `{type: 'tool', name}`; 'auto' and 'none' leave the choice to the model.
  tool_choice: z.object({ type: z.string(), name: z.string().optional() }).optional(),
});

function textOf(content: z.infer<typeof ContentSchema> | null | undefined): string {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  return content.map((block) => (block.type === 'text' ? (block.text ?? '') : '')).join('');
}

/** What a request of either API says, as far as this server reads it. */
export interface ParsedRequest {
  model: string;
  /** The system prompt: Messages' `system`; chat completions carry theirs as a message. */
  system: string;
  /** Each message's text (its text blocks, joined). */
  messages: { role: string; text: string }[];
  /** The most output tokens the request asks for, when it says. */
  maxTokens: number | undefined;
  /**
   * The JSON schema the answer must follow: the forced tool's input schema, else the structured output's schema
   * (chat completions' `response_format.json_schema.schema`, Messages' `output_config.format.schema` or the
   * beta's `output_format.schema`); undefined when the request asks for none.
   */
  schema: unknown;
  /**
   * The tool the request forces the model to call (`tool_choice` naming it, or asking for any of one or more
   * tools: the first is called): the answer goes back as that tool's call, its input the JSON answer. Undefined
   * when the answer is the message's text.
   */
  forcedTool: string | undefined;
}

/** The request's parts that matter here; undefined when the body is not a request of its API. */
export function parsedRequest(request: Pick<ChatRequest, 'api' | 'body'>): ParsedRequest | undefined {
  if (request.api === 'messages') {
    const parsed = MessagesBodySchema.safeParse(request.body);
    if (!parsed.success) return undefined;
    const { tool_choice: choice } = parsed.data;
    const tools = parsed.data.tools?.filter((t) => t.input_schema !== undefined);
    const tool =
      choice?.type === 'any'
        ? tools?.[0]
        : choice?.type === 'tool'
          ? tools?.find((t) => t.name === choice.name)
          : undefined;
    const format = parsed.data.output_config?.format ?? parsed.data.output_format;
    return {
      model: parsed.data.model ?? 'stand-in',
      system: textOf(parsed.data.system),
      messages: parsed.data.messages.map((m) => ({ role: m.role, text: textOf(m.content) })),
      maxTokens: parsed.data.max_tokens,
      schema:
        tool !== undefined ? tool.input_schema : format?.type === 'json_schema' ? format.schema : undefined,
      forcedTool: tool?.name,
    };
  }
  const parsed = ChatBodySchema.safeParse(request.body);
  if (!parsed.success) return undefined;
  const { tool_choice: choice } = parsed.data;
  const tools = parsed.data.tools?.flatMap((t) => (t.function === undefined ? [] : [t.function]));
  const tool =
    choice === 'required'
      ? tools?.[0]
      : typeof choice === 'object' && choice.function !== undefined
        ? tools?.find((t) => t.name === choice.function?.name)
        : undefined;
  const format = parsed.data.response_format;
  return {
    model: parsed.data.model ?? 'stand-in',
    system: '',
    messages: parsed.data.messages.map((m) => ({ role: m.role, text: textOf(m.content) })),
    // OpenAI's newer name first; a request sends one of them.
    maxTokens: parsed.data.max_completion_tokens ?? parsed.data.max_tokens,
    // A function without parameters takes any JSON object.
    schema:
      tool !== undefined
        ? (tool.parameters ?? { type: 'object' })
        : format?.type === 'json_schema'
          ? format.json_schema?.schema
          : undefined,
    forcedTool: tool?.name,
  };
}

/**
 * All the text a request sends, in the order the model reads it (the system prompt, then every message), as one
 * string: what its prompt tokens are counted from, and what a prompt cache compares.
 */
export function promptText(request: Pick<ChatRequest, 'api' | 'body'>): string {
  const parsed = parsedRequest(request);
  if (parsed === undefined) return '';
  return parsed.system + parsed.messages.map((m) => m.text).join('');
}

/** Tokens as this server counts them: a quarter of the characters, rounded up. */
export function estimateTokens(text: string): number {
  return Math.ceil(text.length / 4);
}

/**
 * The demo model's answer to a request, from what it asks for rather than which step asks (demo-answer.ts): the
 * document's first sentence, or, when the request asks for a JSON schema, JSON that satisfies it (the tag step's
 * `{"tags": [...]}` holds the document's most frequent long words). Undefined when the body is not a request of
 * its API, or has no user text.
 */
export function demoContent(request: Pick<ChatRequest, 'api' | 'body'>): string | undefined {
  const parsed = parsedRequest(request);
  const userText = parsed?.messages.find((m) => m.role === 'user')?.text ?? '';
  if (parsed === undefined || userText === '') return undefined;
  // The document, when the prompt wraps it in <document> tags beside the task.
  const text = /<document>\n?([\s\S]*?)\n?<\/document>/.exec(userText)?.[1] ?? userText;
  return demoAnswer(text, parsed.schema);
}

/** The 400 a provider answers to a body that is not a request of its API. */
export function invalidRequest(api: ChatApi): Exclude<ChatReply, 'hang'> {
  return errorReply(api, 400, {
    type: 'invalid_request_error',
    message:
      api === 'messages'
        ? 'expected a Messages request: model, max_tokens and messages with user text'
        : 'expected a chat completion request: messages with user text',
  });
}

/**
 * The demo's model: answers after `delayMs` in the API's own shape, with usage counted by estimateTokens (the whole
 * prompt in, the answer out). A body that is not a request of its API gets a 400, as a real provider's would.
 */
export function demoModel(delayMs: number | (() => number)): ChatScript {
  return (request) => {
    const content = demoContent(request);
    if (content === undefined) return invalidRequest(request.api);
    const delay = typeof delayMs === 'number' ? delayMs : delayMs();
    const usage = { inputTokens: estimateTokens(promptText(request)), outputTokens: estimateTokens(content) };
    return { body: answerBody(request, content, usage), delayMs: delay };
  };
}
