/**
 * Every model provider MODEL can name, against a loopback server speaking that provider's real wire format:
 * OpenAI's Responses API, Anthropic's Messages API, and OpenAI chat completions as Ollama serves them (the demo's
 * model server). Each call must be exactly one HTTP request (the AI SDK's own retries are off) carrying the step's
 * Idempotency-Key and the activity's abort signal; each error shape must be sorted as the retry policy needs it.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { describe, it } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { msToNumber } from '@temporalio/common/lib/time';
import { z } from 'zod';
import { loadConfig } from '../src/config';
import { FailureType } from '../src/contract';
import type { Usage } from '../src/contract';
import { createModel } from '../src/dependencies';
import { closeServer, listenOnLoopback, readBody } from '../src/lib/loopback';
import { AiSdkModel } from '../src/model/ai-sdk';
import { BusyDetailsSchema } from '../src/model/pacer';
import { DEFAULT_PRICES, estimateCost } from '../src/model/pricing';
import { remoteModel } from '../src/model/choose';
import { findProvider } from '../src/model/providers';
import type { DocumentModel, ModelCall } from '../src/model/types';
import { applicationFailure, modelServerFor, SAMPLE_TEXT, until } from './helpers';
import { cleanupAfterAll } from './scratch';
import type { ChatReply } from './helpers';
import { summarizeRequest } from './requests';
import { tagRequest } from './requests';

const defer = cleanupAfterAll();
const KEY = 'run-1:tag';

/** One request as a provider's server saw it. */
interface Seen {
  path: string;
  idempotencyKey: string | undefined;
  /** The step the request says it is for (`x-pipeline-step`). */
  step: string | undefined;
  /** The header that carries the API key: Authorization for OpenAI's wires, x-api-key for Anthropic's. */
  credential: string | undefined;
  body: unknown;
  /** The client hung up before the answer was sent. */
  cutOff: boolean;
}

interface WireServer {
  baseUrl: string;
  requests: Seen[];
}

type Script = (request: Seen) => ChatReply;
type Reply = Exclude<ChatReply, 'hang'>;

/** A loopback server that records each request and answers what `script` says, on any path. */
async function recordingServer(script: Script, credentialHeader: string): Promise<WireServer> {
  const requests: Seen[] = [];
  const server = http.createServer((req, res) => {
    void readBody(req).then((raw) => {
      const header = (name: string) => {
        const value = req.headers[name];
        return typeof value === 'string' ? value : undefined;
      };
      const seen: Seen = {
        path: req.url ?? '',
        idempotencyKey: header('idempotency-key'),
        step: header('x-pipeline-step'),
        credential: header(credentialHeader),
        body: JSON.parse(raw.toString('utf8')),
        cutOff: false,
      };
      requests.push(seen);
      res.on('close', () => {
        if (!res.writableFinished) seen.cutOff = true;
      });
      const reply = script(seen);
      if (reply === 'hang') return;
      res.writeHead(reply.status ?? 200, { 'content-type': 'application/json', ...reply.headers });
      res.end(typeof reply.body === 'string' ? reply.body : JSON.stringify(reply.body));
    });
  });
  const origin = await listenOnLoopback(server, 'provider stand-in');
  defer(() => closeServer(server));
  return { baseUrl: `${origin}/v1`, requests };
}

/** What each provider's wire looks like: its answers, its error bodies, and where a request says what. */
interface Wire {
  provider: string;
  model: string;
  path: string;
  /** The credential header's value for API key `test-key`. */
  credential: string;
  start(script: Script): Promise<WireServer>;
  answer(text: string, usage: Usage): unknown;
  /** An answer cut off at the token limit. */
  truncated(text: string, usage: Usage): unknown;
  /** The provider's error body for a status. */
  error(status: number): Reply;
  /** The JSON schema the request asks the answer to follow; undefined when it asks for none. */
  schemaOf(body: unknown): unknown;
  maxTokensOf(body: unknown): number | undefined;
  /** What the model reads, in order: the system text, then each text block of the user's message. */
  blocksOf(body: unknown): PromptBlock[];
}

interface PromptBlock {
  text: string;
  /** The block's prompt-cache mark (Anthropic's `cache_control`), if any. */
  cacheControl?: unknown;
}

/** The longest start `a` and `b` share. */
function commonPrefix(a: string, b: string): string {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return a.slice(0, n);
}

/** The text the model reads, in order. */
function promptText(wire: Wire, body: unknown): string {
  return wire
    .blocksOf(body)
    .map((b) => b.text)
    .join('\n');
}

const OpenAIError = (type: string, code: string | null, message: string) => ({
  error: { message, type, param: null, code },
});

const ResponsesBody = z.object({
  input: z.array(
    z.object({
      role: z.string(),
      content: z.union([z.string(), z.array(z.object({ type: z.literal('input_text'), text: z.string() }))]),
    }),
  ),
  text: z.object({ format: z.object({ type: z.string(), schema: z.unknown() }) }).optional(),
  max_output_tokens: z.number().optional(),
});

const responses: Wire = {
  provider: 'openai',
  model: 'gpt-4o-mini',
  path: '/v1/responses',
  credential: 'Bearer test-key',
  start: (script) => recordingServer(script, 'authorization'),
  answer: (text, usage) => responsesBody(text, usage, null),
  truncated: (text, usage) => responsesBody(text, usage, { reason: 'max_output_tokens' }),
  error: (status) => ({
    status,
    body:
      status === 429
        ? OpenAIError('requests', 'rate_limit_exceeded', 'Rate limit reached for gpt-4o-mini')
        : status === 401
          ? OpenAIError('invalid_request_error', 'invalid_api_key', 'Incorrect API key provided: sk-te***')
          : status === 400
            ? OpenAIError('invalid_request_error', 'invalid_value', "Invalid value for 'text.format'")
            : OpenAIError('server_error', null, 'The server had an error while processing your request.'),
  }),
  schemaOf: (body) => {
    const format = ResponsesBody.parse(body).text?.format;
    return format?.type === 'json_schema' ? format.schema : undefined;
  },
  maxTokensOf: (body) => ResponsesBody.parse(body).max_output_tokens,
  blocksOf: (body) =>
    ResponsesBody.parse(body).input.flatMap(({ content }) =>
      typeof content === 'string' ? [{ text: content }] : content.map(({ text }) => ({ text })),
    ),
};

function responsesBody(text: string, usage: Usage, incomplete: { reason: string } | null): unknown {
  return {
    id: 'resp_1',
    object: 'response',
    created_at: 1_760_000_000,
    status: incomplete === null ? 'completed' : 'incomplete',
    incomplete_details: incomplete,
    model: 'gpt-4o-mini-2024-07-18',
    output: [
      {
        type: 'message',
        id: 'msg_1',
        status: incomplete === null ? 'completed' : 'incomplete',
        role: 'assistant',
        content: [{ type: 'output_text', text, annotations: [] }],
      },
    ],
    usage: {
      input_tokens: usage.inputTokens,
      input_tokens_details: { cached_tokens: usage.cachedInputTokens ?? 0 },
      output_tokens: usage.outputTokens,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: usage.inputTokens + usage.outputTokens,
    },
  };
}

const MessagesText = z.object({
  type: z.literal('text'),
  text: z.string(),
  cache_control: z.unknown().optional(),
});
const MessagesBody = z.object({
  system: z.array(MessagesText).optional(),
  messages: z.array(z.object({ role: z.string(), content: z.union([z.string(), z.array(MessagesText)]) })),
  max_tokens: z.number(),
  output_config: z.object({ format: z.object({ type: z.string(), schema: z.unknown() }) }).optional(),
});

const AnthropicError = (type: string, message: string) => ({ type: 'error', error: { type, message } });

const messages: Wire = {
  provider: 'anthropic',
  model: 'claude-haiku-4-5',
  path: '/v1/messages',
  credential: 'test-key',
  start: (script) => recordingServer(script, 'x-api-key'),
  answer: (text, usage) => messagesBody(text, usage, 'end_turn'),
  truncated: (text, usage) => messagesBody(text, usage, 'max_tokens'),
  error: (status) => ({
    status,
    body:
      status === 429
        ? AnthropicError(
            'rate_limit_error',
            'Number of request tokens has exceeded your per-minute rate limit',
          )
        : status === 401
          ? AnthropicError('authentication_error', 'invalid x-api-key')
          : status === 400
            ? AnthropicError('invalid_request_error', 'max_tokens: Field required')
            : status === 529
              ? AnthropicError('overloaded_error', 'Overloaded')
              : AnthropicError('api_error', 'Internal server error'),
  }),
  schemaOf: (body) => {
    const format = MessagesBody.parse(body).output_config?.format;
    return format?.type === 'json_schema' ? format.schema : undefined;
  },
  // Anthropic requires max_tokens on every request; the SDK sends the model's own limit unless capped.
  maxTokensOf: (body) => {
    const max = MessagesBody.parse(body).max_tokens;
    return max >= 64_000 ? undefined : max;
  },
  blocksOf: (body) => {
    const { system, messages } = MessagesBody.parse(body);
    return [system ?? [], ...messages.map((m) => m.content)].flatMap((content) =>
      typeof content === 'string'
        ? [{ text: content }]
        : content.map((b) => ({
            text: b.text,
            ...(b.cache_control === undefined ? {} : { cacheControl: b.cache_control }),
          })),
    );
  },
};

function messagesBody(text: string, usage: Usage, stopReason: string): unknown {
  return {
    id: 'msg_01',
    type: 'message',
    role: 'assistant',
    model: 'claude-haiku-4-5-20251001',
    content: [{ type: 'text', text }],
    stop_reason: stopReason,
    stop_sequence: null,
    // Anthropic's input_tokens counts only the input after the last cache breakpoint: the cache's share is apart.
    usage: {
      input_tokens: usage.inputTokens - (usage.cachedInputTokens ?? 0) - (usage.cacheWriteInputTokens ?? 0),
      cache_read_input_tokens: usage.cachedInputTokens ?? 0,
      cache_creation_input_tokens: usage.cacheWriteInputTokens ?? 0,
      output_tokens: usage.outputTokens,
    },
  };
}

const ChatBody = z.object({
  messages: z.array(
    z.object({
      role: z.string(),
      content: z.union([z.string(), z.array(z.object({ type: z.literal('text'), text: z.string() }))]),
    }),
  ),
  response_format: z.object({ type: z.string(), json_schema: z.object({ schema: z.unknown() }) }).optional(),
  max_tokens: z.number().optional(),
});

/** Ollama's OpenAI-compatible endpoint, played by the demo's model server (demo/model-server.ts). */
const ollamaChat: Wire = {
  provider: 'ollama',
  model: 'llama3.1',
  path: '/v1/chat/completions',
  credential: 'Bearer test-key',
  start: async (script) => {
    const server = await modelServerFor(defer, (request) =>
      script({
        path: '/v1/chat/completions',
        idempotencyKey: request.idempotencyKey,
        step: request.step,
        credential: request.authorization,
        body: request.body,
        cutOff: false,
      }),
    );
    return {
      baseUrl: server.baseUrl,
      get requests() {
        return server.requests.map((r) => ({
          path: '/v1/chat/completions',
          idempotencyKey: r.idempotencyKey,
          step: r.step,
          credential: r.authorization,
          body: r.body,
          cutOff: r.cutOff,
        }));
      },
    };
  },
  answer: (text, usage) => chatBody(text, usage, 'stop'),
  truncated: (text, usage) => chatBody(text, usage, 'length'),
  error: (status) => ({
    status,
    body:
      status === 404
        ? OpenAIError('api_error', null, 'model "llama3.1" not found, try pulling it first')
        : status === 400
          ? OpenAIError('invalid_request_error', null, 'invalid JSON schema in format')
          : OpenAIError(
              'api_error',
              null,
              status === 429 ? 'server busy, please try again' : 'unexpected EOF',
            ),
  }),
  schemaOf: (body) => {
    const format = ChatBody.parse(body).response_format;
    return format?.type === 'json_schema' ? format.json_schema.schema : undefined;
  },
  maxTokensOf: (body) => ChatBody.parse(body).max_tokens,
  blocksOf: (body) =>
    ChatBody.parse(body).messages.flatMap(({ content }) =>
      typeof content === 'string' ? [{ text: content }] : content.map(({ text }) => ({ text })),
    ),
};

function chatBody(content: string, usage: Usage, finishReason: string): unknown {
  return {
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1_760_000_000,
    model: 'llama3.1',
    system_fingerprint: 'fp_ollama',
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: finishReason }],
    usage: {
      prompt_tokens: usage.inputTokens,
      completion_tokens: usage.outputTokens,
      total_tokens: usage.inputTokens + usage.outputTokens,
      ...(usage.cachedInputTokens === undefined
        ? {}
        : { prompt_tokens_details: { cached_tokens: usage.cachedInputTokens } }),
    },
  };
}

const WIRES = [responses, messages, ollamaChat];
const USAGE = { inputTokens: 321, outputTokens: 17 };
const TAGS_JSON = '{"tags": ["Checkpoints", "idempotency", "checkpoints"]}';

function modelFor(wire: Wire, server: WireServer, requestTimeoutMs = 5_000): AiSdkModel {
  const provider = findProvider(wire.provider);
  assert.ok(provider, `no provider ${wire.provider}`);
  return new AiSdkModel(
    remoteModel(provider, { model: wire.model, baseUrl: server.baseUrl, apiKey: 'test-key' }),
    requestTimeoutMs,
  );
}

function call(overrides: Partial<ModelCall> = {}): ModelCall {
  return { idempotencyKey: KEY, signal: new AbortController().signal, ...overrides };
}

/** The usage a refused paid answer carries, which model-step.ts records as rejectedUsage. */
function paidUsage(f: ApplicationFailure): unknown {
  return z.object({ paidUsage: z.unknown() }).parse(f.details?.[0]).paidUsage;
}

/**
 * A provider's push-back: retryable ProviderBusy (never a provider error) whose details say whether it was an
 * overload and carry its Retry-After, which is also the next retry's delay (the policy's backoff without one).
 */
function busy(
  message: RegExp[],
  expected: { overloaded: boolean; retryAfterMs?: number },
): (err: unknown) => boolean {
  return applicationFailure(FailureType.ProviderBusy, true, message, (f) => {
    const details = BusyDetailsSchema.parse(f.details?.[0]);
    assert.equal(details.overloaded, expected.overloaded);
    assert.equal(details.retryAfterMs, expected.retryAfterMs);
    if (expected.retryAfterMs === undefined) {
      assert.equal(f.nextRetryDelay, undefined);
    } else {
      assert.ok(f.nextRetryDelay !== undefined && f.nextRetryDelay !== null, 'no nextRetryDelay');
      assert.equal(msToNumber(f.nextRetryDelay), expected.retryAfterMs);
    }
  });
}

for (const wire of WIRES) {
  describe(`${wire.provider} (${wire.path})`, () => {
    it('summarizes and tags, one request each, with the Idempotency-Key, the key and usage from the wire', async () => {
      const server = await wire.start((request) => ({
        body: wire.answer(wire.schemaOf(request.body) === undefined ? ' A summary. ' : TAGS_JSON, USAGE),
      }));
      const model = modelFor(wire, server);
      const summary = await model.ask(summarizeRequest(2), SAMPLE_TEXT, call());
      assert.deepEqual(summary, { value: { summary: 'A summary.' }, usage: USAGE });
      const tags = await model.ask(tagRequest(5), SAMPLE_TEXT, call());
      assert.deepEqual(tags, { value: { tags: ['checkpoints', 'idempotency'] }, usage: USAGE });
      assert.deepEqual(model.info, { provider: wire.provider, model: wire.model });

      assert.equal(server.requests.length, 2);
      const [plain, tagged] = server.requests;
      for (const request of server.requests) {
        assert.equal(request.path, wire.path);
        assert.equal(request.idempotencyKey, KEY);
        assert.equal(request.credential, wire.credential);
      }
      // Every request caps its answer, the first one too: a rate limiter reserves the cap before the call.
      assert.equal(wire.maxTokensOf(plain?.body), summarizeRequest(2).maxOutputTokens);
      assert.equal(wire.maxTokensOf(tagged?.body), tagRequest(5).maxOutputTokens);
      assert.equal(wire.schemaOf(plain?.body), undefined, 'the summary asked for structured output');
      // The tag schema goes out as JSON schema, without the length checks strict modes refuse.
      assert.deepEqual(
        z
          .object({ properties: z.object({ tags: z.object({ type: z.string(), items: z.unknown() }) }) })
          .parse(wire.schemaOf(tagged?.body)).properties.tags,
        { type: 'array', items: { type: 'string' } },
      );
    });

    it('both steps send the system line and the document first, the same prefix, then their task, and name their step', async () => {
      // Recorded here for every wire, the demo's chat server included: the test must see the header itself.
      const server = await recordingServer(
        (request) => ({ body: wire.answer(request.step === 'tag' ? TAGS_JSON : 'A summary.', USAGE) }),
        'authorization',
      );
      const model = modelFor(wire, server);
      await model.ask(summarizeRequest(2), SAMPLE_TEXT, call());
      await model.ask(tagRequest(5), SAMPLE_TEXT, call());
      assert.deepEqual(
        server.requests.map((r) => r.step),
        ['summarize', 'tag'],
      );
      const [summarize, tag] = server.requests.map((r) => promptText(wire, r.body));
      assert.ok(summarize !== undefined && tag !== undefined);
      const shared = commonPrefix(summarize, tag);
      assert.ok(shared.includes(SAMPLE_TEXT), `the two steps' prompts share only ${JSON.stringify(shared)}`);
      assert.match(summarize.slice(shared.length), /^Summarize the document above in at most 2 sentences/);
      assert.match(tag.slice(shared.length), /^Give at most 5 topic tags for the document above/);
      // Anthropic caches a prefix only up to a block the request marks: the document's own block, in both steps.
      for (const request of server.requests) {
        const marked = wire.blocksOf(request.body).filter((b) => b.cacheControl !== undefined);
        if (wire.provider !== 'anthropic') {
          assert.deepEqual(marked, []);
          continue;
        }
        assert.deepEqual(
          marked.map((b) => b.cacheControl),
          [{ type: 'ephemeral' }],
        );
        assert.ok(
          marked[0]?.text.includes(SAMPLE_TEXT) && shared.includes(marked[0].text),
          'not the document',
        );
      }
    });

    it("prompt-cache tokens: every input token counted, the cache's share kept apart and priced at its rates", async () => {
      const usage: Usage = {
        inputTokens: 5_000,
        outputTokens: 40,
        cachedInputTokens: 4_000,
        // Only Anthropic bills writing to its cache.
        ...(wire.provider === 'anthropic' ? { cacheWriteInputTokens: 600 } : {}),
      };
      const server = await wire.start(() => ({ body: wire.answer('A summary.', usage) }));
      const model = modelFor(wire, server);
      const answer = await model.ask(summarizeRequest(2), SAMPLE_TEXT, call());
      assert.deepEqual(answer.usage, usage);

      const prices = {
        ...DEFAULT_PRICES,
        'llama3.1': { inputPerMillion: 1, cachedInputPerMillion: 0.5, outputPerMillion: 2 },
      };
      // Dollars per million: the uncached input at the input price, the cache's share at its own.
      const expected = {
        openai: 1_000 * 0.15 + 4_000 * 0.075 + 40 * 0.6,
        anthropic: 400 * 1 + 4_000 * 0.1 + 600 * 1.25 + 40 * 5,
        ollama: 1_000 * 1 + 4_000 * 0.5 + 40 * 2,
      }[wire.provider];
      assert.ok(expected !== undefined);
      const cost = estimateCost(prices, model.info, answer.usage);
      assert.ok(cost !== null && Math.abs(cost - expected / 1_000_000) < 1e-12, `cost ${cost}`);
    });

    it('a retry after a refused answer quotes the refusal and caps the tokens', async () => {
      const server = await wire.start(() => ({ body: wire.answer(TAGS_JSON, USAGE) }));
      await modelFor(wire, server).ask(tagRequest(3), SAMPLE_TEXT, call({ retryHint: 'it was cut off' }));
      const [request] = server.requests;
      const blocks = wire.blocksOf(request?.body);
      // The refusal is quoted after the document, in the step's task: the prefix a prompt cache holds is unchanged.
      assert.match(
        blocks.at(-1)?.text ?? '',
        /Your previous answer to this request was refused: it was cut off\. Answer again/,
      );
      assert.ok(
        promptText(wire, request?.body).indexOf(SAMPLE_TEXT) <
          promptText(wire, request?.body).indexOf('Your previous answer'),
        'the refusal came before the document',
      );
      assert.equal(wire.maxTokensOf(request?.body), 24 * 3 + 60);
    });

    it('429 with Retry-After is back-pressure (ProviderBusy) after exactly that delay, in one request (the SDK does not retry)', async () => {
      const server = await wire.start(() => ({ ...wire.error(429), headers: { 'retry-after': '7' } }));
      await assert.rejects(
        modelFor(wire, server).ask(summarizeRequest(2), SAMPLE_TEXT, call()),
        busy([/HTTP 429 \(rate limited\); Retry-After 7 s/], { overloaded: false, retryAfterMs: 7_000 }),
      );
      assert.equal(server.requests.length, 1, 'the SDK retried on its own');
    });

    it('429 with a retry-after-ms beyond a day waits a day, as a Retry-After would', async () => {
      const server = await wire.start(() => ({ ...wire.error(429), headers: { 'retry-after-ms': '9e12' } }));
      await assert.rejects(
        modelFor(wire, server).ask(summarizeRequest(2), SAMPLE_TEXT, call()),
        busy([/HTTP 429/], { overloaded: false, retryAfterMs: 24 * 60 * 60 * 1000 }),
      );
    });

    it('429 with retry-after-ms (as OpenAI sends it) waits that many milliseconds', async () => {
      const server = await wire.start(() => ({
        ...wire.error(429),
        headers: { 'retry-after-ms': '1500', 'retry-after': '2' },
      }));
      await assert.rejects(
        modelFor(wire, server).ask(summarizeRequest(2), SAMPLE_TEXT, call()),
        busy([/HTTP 429/], { overloaded: false, retryAfterMs: 1_500 }),
      );
    });

    it('429 with a retry-after-ms below a second says it to the millisecond, not "0 s"', async () => {
      const server = await wire.start(() => ({ ...wire.error(429), headers: { 'retry-after-ms': '400' } }));
      await assert.rejects(
        modelFor(wire, server).ask(summarizeRequest(2), SAMPLE_TEXT, call()),
        busy([/HTTP 429 \(rate limited\); Retry-After 400 ms/], { overloaded: false, retryAfterMs: 400 }),
      );
    });

    it("a 500 in the provider's error shape is retryable TransientModelError with the policy's backoff, in one request", async () => {
      const server = await wire.start(() => wire.error(500));
      await assert.rejects(
        modelFor(wire, server).ask(tagRequest(3), SAMPLE_TEXT, call()),
        applicationFailure(FailureType.TransientModelError, true, [/HTTP 500/, /error/], (f) =>
          assert.equal(f.nextRetryDelay, undefined),
        ),
      );
      assert.equal(server.requests.length, 1, 'the SDK retried on its own');
    });

    const overload = wire.provider === 'anthropic' ? 529 : 503;
    it(`an overload (${overload}) in the provider's error shape is back-pressure (ProviderBusy) with the policy's backoff, in one request`, async () => {
      const server = await wire.start(() => wire.error(overload));
      await assert.rejects(
        modelFor(wire, server).ask(tagRequest(3), SAMPLE_TEXT, call()),
        busy([new RegExp(`HTTP ${overload} \\(overloaded\\)`), /error/], { overloaded: true }),
      );
      assert.equal(server.requests.length, 1, 'the SDK retried on its own');
    });

    const rejections = [
      {
        status: 401,
        hint: wire.provider === 'anthropic' ? /check ANTHROPIC_API_KEY/ : /check OPENAI_API_KEY/,
      },
      { status: 400, hint: /check MODEL and the request the server rejects/ },
      ...(wire.provider === 'ollama'
        ? [{ status: 404, hint: /check OPENAI_BASE_URL \(it should end in \/v1\) and MODEL/ }]
        : []),
    ];
    for (const { status, hint } of rejections) {
      it(`${status} is non-retryable ModelRejected with a hint`, async () => {
        const server = await wire.start(() => wire.error(status));
        await assert.rejects(
          modelFor(wire, server).ask(summarizeRequest(2), SAMPLE_TEXT, call()),
          applicationFailure(FailureType.ModelRejected, false, [
            new RegExp(`answered HTTP ${status}: \\{`),
            hint,
          ]),
        );
        assert.equal(server.requests.length, 1);
      });
    }

    for (const step of ['summarize', 'tag'] as const) {
      it(`a ${step} answer cut off at the token limit is retryable and carries its paid usage`, async () => {
        const server = await wire.start(() => ({ body: wire.truncated('{"tags": ["checkp', USAGE) }));
        const model: DocumentModel = modelFor(wire, server);
        await assert.rejects(
          step === 'tag'
            ? model.ask(tagRequest(3), SAMPLE_TEXT, call())
            : model.ask(summarizeRequest(2), SAMPLE_TEXT, call()),
          applicationFailure(
            FailureType.ModelOutputInvalid,
            true,
            [/cut off \(finish reason "length"\)/],
            (f) => assert.deepEqual(paidUsage(f), USAGE),
          ),
        );
      });
    }

    const malformed = [
      { name: 'one string for the list', text: '{"tags": "checkpoints, idempotency"}', field: /\(tags: / },
      {
        name: 'an empty tag',
        text: '{"tags": ["checkpoints", "  "]}',
        field: /\(tags\.1: must not be empty/,
      },
      { name: 'no tags', text: '{"tags": []}', field: /\(tags: must hold at least one tag/ },
      { name: 'prose instead of JSON', text: 'Tags: checkpoints, idempotency', field: /\(not JSON\)/ },
    ];
    for (const { name, text, field } of malformed) {
      it(`a tag object with ${name} is retryable ModelOutputInvalid naming the field, with its paid usage`, async () => {
        const server = await wire.start(() => ({ body: wire.answer(text, USAGE) }));
        await assert.rejects(
          modelFor(wire, server).ask(tagRequest(3), SAMPLE_TEXT, call()),
          applicationFailure(
            FailureType.ModelOutputInvalid,
            true,
            [/did not answer with \{"tags": \[\.\.\.\]\}/, field],
            (f) => assert.deepEqual(paidUsage(f), USAGE),
          ),
        );
        assert.equal(server.requests.length, 1);
      });
    }

    it("the activity's abort signal cancels the request at once", async () => {
      const server = await wire.start(() => 'hang');
      const controller = new AbortController();
      const asked = modelFor(wire, server).ask(
        summarizeRequest(2),
        SAMPLE_TEXT,
        call({ signal: controller.signal }),
      );
      await until(() => server.requests.length === 1, 'the request to arrive');
      const reason = new Error('activity cancelled');
      controller.abort(reason);
      await assert.rejects(asked, (err) => err === reason);
      await until(() => server.requests[0]?.cutOff === true, 'the request to be cut off');
    });
  });
}

describe('switching provider is one variable', () => {
  const cases = [
    {
      env: { MODEL: 'openai:gpt-4o-mini', OPENAI_API_KEY: 'test-key' },
      wire: responses,
      base: 'OPENAI_BASE_URL',
    },
    {
      env: { MODEL: 'anthropic:claude-haiku-4-5', ANTHROPIC_API_KEY: 'test-key' },
      wire: messages,
      base: 'ANTHROPIC_BASE_URL',
    },
    {
      env: { MODEL: 'ollama:llama3.1', OPENAI_API_KEY: 'test-key' },
      wire: ollamaChat,
      base: 'OPENAI_BASE_URL',
    },
    {
      env: { MODEL: 'openai-compatible:llama3.1', OPENAI_API_KEY: 'test-key' },
      wire: ollamaChat,
      base: 'OPENAI_BASE_URL',
    },
    {
      env: { OPENAI_MODEL: 'llama3.1', OPENAI_API_KEY: 'test-key' },
      wire: ollamaChat,
      base: 'OPENAI_BASE_URL',
    },
  ];
  for (const { env, wire, base } of cases) {
    const chosen =
      'MODEL' in env ? `MODEL=${env.MODEL}` : `OPENAI_BASE_URL + OPENAI_MODEL=${env.OPENAI_MODEL}`;
    it(`${chosen} speaks ${wire.path}`, async () => {
      const server = await wire.start(() => ({ body: wire.answer('A summary.', USAGE) }));
      const model = createModel(loadConfig({ ...env, [base]: server.baseUrl }));
      const answer = await model.ask(summarizeRequest(1), SAMPLE_TEXT, call());
      assert.deepEqual(answer.value, { summary: 'A summary.' });
      assert.equal(server.requests[0]?.path, wire.path);
      assert.equal(server.requests[0]?.credential, wire.credential);
    });
  }

  it('without MODEL the offline model stays the default', () => {
    assert.deepEqual(createModel(loadConfig({})).info, { provider: 'offline', model: 'extractive-wink-nlp' });
  });
});
