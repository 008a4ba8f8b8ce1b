/**
 * The demo model server answers what a request asks for, never which step asks: the document's first sentence
 * when the request sends no schema, and JSON that satisfies the schema it sends (the tag step's, or one no step
 * has sent before), in the place each API puts a structured answer. Raw HTTP the way each API's clients send
 * it, then the AI SDK's own clients reading the answers.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, Output } from 'ai';
import type { LanguageModel } from 'ai';
import { z } from 'zod';
import { demoModel, startModelServer } from '../demo/model-server';
import type { ChatApi, ModelServer } from '../demo/model-server';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();

const DOCUMENT = [
  '# Checkpoints',
  '',
  'Checkpoints let a document pipeline resume after a crash without paying the model provider twice for its work.',
  'Every finished step leaves a checkpoint, and a restarted pipeline skips the steps its checkpoints record.',
  'Checkpoints cost little; repeated provider calls cost money.',
].join('\n');
const FIRST_SENTENCE =
  'Checkpoints let a document pipeline resume after a crash without paying the model provider twice for its work.';
/** The document's three most frequent words of six letters or more, most frequent first. */
const FREQUENT_WORDS = ['checkpoints', 'pipeline', 'provider'];

/** The prompt as the pipeline sends it: the document between tags, then the step's task. */
const PROMPT = `<document>\n${DOCUMENT}\n</document>\n\nDo the task for the document above.`;

/** The tag step's schema, as the AI SDK sends it. */
const TAG_SCHEMA = {
  $schema: 'http://json-schema.org/draft-07/schema#',
  type: 'object',
  properties: {
    tags: {
      type: 'array',
      items: { type: 'string' },
      description: 'short lowercase topic tags, most relevant first',
    },
  },
  required: ['tags'],
  additionalProperties: false,
};

/** A schema no step of the pipeline sends. */
const NEW_SCHEMA: z.core.JSONSchema.JSONSchema = {
  type: 'object',
  properties: {
    headline: { type: 'string', maxLength: 80 },
    audience: { type: 'string', enum: ['beginners', 'experts'] },
    score: { type: 'number', minimum: 0, maximum: 1 },
    items: {
      type: 'array',
      items: { type: 'object', properties: { label: { type: 'string' } }, required: ['label'] },
    },
  },
  required: ['headline', 'audience', 'score', 'items'],
  additionalProperties: false,
};

/** The demo's answer to NEW_SCHEMA: the first sentence cut to 80 characters, the first enum value, 0.5, one item. */
const NEW_ANSWER = {
  headline: `${FIRST_SENTENCE.slice(0, 79)}…`,
  audience: 'beginners',
  score: 0.5,
  items: [{ label: FIRST_SENTENCE }],
};

const ChatAnswerSchema = z.object({
  choices: z
    .array(
      z.object({
        message: z.object({
          content: z.string().nullable(),
          tool_calls: z
            .array(
              z.object({
                type: z.literal('function'),
                function: z.object({ name: z.string(), arguments: z.string() }),
              }),
            )
            .optional(),
        }),
        finish_reason: z.string(),
      }),
    )
    .length(1),
});

const MessagesAnswerSchema = z.object({
  content: z
    .array(
      z.discriminatedUnion('type', [
        z.object({ type: z.literal('text'), text: z.string() }),
        z.object({ type: z.literal('tool_use'), name: z.string(), input: z.record(z.string(), z.unknown()) }),
      ]),
    )
    .length(1),
  stop_reason: z.string(),
});

/** One way an API's client asks for a structured answer, and where that answer comes back. */
interface Wire {
  name: string;
  api: ChatApi;
  /** The request's body, asking for an answer that follows `schema`. */
  body(schema: unknown): unknown;
  /** The answer's JSON, from wherever the API puts it. */
  answer(body: unknown): string;
}

const chatText = (body: unknown): string => {
  const [choice] = ChatAnswerSchema.parse(body).choices;
  assert.equal(choice?.finish_reason, 'stop');
  return choice?.message.content ?? '';
};

const messagesText = (body: unknown): string => {
  const answer = MessagesAnswerSchema.parse(body);
  const [block] = answer.content;
  assert.ok(block?.type === 'text', JSON.stringify(body));
  assert.equal(answer.stop_reason, 'end_turn');
  return block.text;
};

const chatBase = { model: 'stand-in', messages: [{ role: 'user', content: PROMPT }] };
const messagesBase = {
  model: 'claude-haiku-4-5',
  max_tokens: 400,
  system: [{ type: 'text', text: 'You work on the one document the user sends.' }],
  messages: [{ role: 'user', content: [{ type: 'text', text: PROMPT }] }],
};

/** Each API asking for text: the request sends no schema. */
const TEXT: Record<ChatApi, { body: unknown; answer(body: unknown): string }> = {
  chat: { body: chatBase, answer: chatText },
  messages: { body: messagesBase, answer: messagesText },
};

const WIRES: Wire[] = [
  {
    name: 'chat completions, response_format json_schema',
    api: 'chat',
    body: (schema) => ({
      ...chatBase,
      response_format: { type: 'json_schema', json_schema: { name: 'answer', schema } },
    }),
    answer: chatText,
  },
  {
    name: 'chat completions, a forced function tool',
    api: 'chat',
    body: (schema) => ({
      ...chatBase,
      tools: [{ type: 'function', function: { name: 'answer', parameters: schema } }],
      tool_choice: { type: 'function', function: { name: 'answer' } },
    }),
    answer: (body) => {
      const [choice] = ChatAnswerSchema.parse(body).choices;
      assert.equal(choice?.finish_reason, 'tool_calls');
      const [call] = choice?.message.tool_calls ?? [];
      assert.ok(call !== undefined && call.function.name === 'answer', JSON.stringify(body));
      return call.function.arguments;
    },
  },
  {
    name: 'Messages, output_config.format',
    api: 'messages',
    body: (schema) => ({ ...messagesBase, output_config: { format: { type: 'json_schema', schema } } }),
    answer: messagesText,
  },
  {
    name: "Messages, the structured-outputs beta's output_format",
    api: 'messages',
    body: (schema) => ({ ...messagesBase, output_format: { type: 'json_schema', schema } }),
    answer: messagesText,
  },
  {
    // What @ai-sdk/anthropic sends for a model without structured outputs: a tool called "json", forced.
    name: 'Messages, a forced tool',
    api: 'messages',
    body: (schema) => ({
      ...messagesBase,
      tools: [
        { name: 'lookup', description: 'An unrelated tool.', input_schema: { type: 'object' } },
        { name: 'json', description: 'Respond with a JSON object.', input_schema: schema },
      ],
      tool_choice: { type: 'tool', name: 'json', disable_parallel_tool_use: true },
    }),
    answer: (body) => {
      const answer = MessagesAnswerSchema.parse(body);
      const [block] = answer.content;
      assert.ok(block?.type === 'tool_use' && block.name === 'json', JSON.stringify(body));
      assert.equal(answer.stop_reason, 'tool_use');
      return JSON.stringify(block.input);
    },
  },
];

const PATHS: Record<ChatApi, string> = { chat: '/chat/completions', messages: '/messages' };

/** The demo's model server, answering at once. */
async function demoServer(): Promise<ModelServer> {
  const server = await startModelServer(demoModel(0));
  defer(() => server.close());
  return server;
}

/** Sends `body` to the API's path, naming `step` in x-pipeline-step unless undefined; returns the 200's body. */
async function send(server: ModelServer, api: ChatApi, body: unknown, step?: string): Promise<unknown> {
  const response = await fetch(`${server.baseUrl}${PATHS[api]}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(api === 'messages' ? { 'x-api-key': 'test', 'anthropic-version': '2023-06-01' } : {}),
      ...(step === undefined ? {} : { 'x-pipeline-step': step }),
    },
    body: JSON.stringify(body),
  });
  const answer: unknown = await response.json();
  assert.equal(response.status, 200, JSON.stringify(answer));
  return answer;
}

describe('the demo model server answers what the request asks for', () => {
  for (const api of ['chat', 'messages'] as const)
    it(`answers ${api} without a schema with the document's first sentence, whichever step asks`, async () => {
      const server = await demoServer();
      assert.equal(TEXT[api].answer(await send(server, api, TEXT[api].body, 'headline')), FIRST_SENTENCE);
    });

  for (const wire of WIRES) {
    it(`answers the tag step's schema with the document's frequent words (${wire.name})`, async () => {
      const server = await demoServer();
      const text = wire.answer(await send(server, wire.api, wire.body(TAG_SCHEMA), 'tag'));
      assert.equal(text, JSON.stringify({ tags: FREQUENT_WORDS }));
    });

    it(`answers a schema no step has sent before with JSON that satisfies it (${wire.name})`, async () => {
      const server = await demoServer();
      const value: unknown = JSON.parse(
        wire.answer(await send(server, wire.api, wire.body(NEW_SCHEMA), 'headline')),
      );
      const checked = z.fromJSONSchema(NEW_SCHEMA).safeParse(value);
      if (!checked.success) assert.fail(`${JSON.stringify(value)}: ${z.prettifyError(checked.error)}`);
      assert.deepEqual(checked.data, NEW_ANSWER);
    });
  }

  it('records the step a request names, undefined when it names none, and answers the same either way', async () => {
    const server = await demoServer();
    const [wire] = WIRES;
    assert.ok(wire);
    const answers = [];
    for (const step of ['tag', 'summarize', undefined])
      answers.push(wire.answer(await send(server, wire.api, wire.body(TAG_SCHEMA), step)));
    assert.deepEqual(new Set(answers), new Set([JSON.stringify({ tags: FREQUENT_WORDS })]));
    assert.deepEqual(
      server.requests.map((r) => r.step),
      ['tag', 'summarize', undefined],
    );
  });
});

describe("the AI SDK's clients read the demo's answer to a new schema", () => {
  const NewAnswerSchema = z.object({
    headline: z.string().max(80),
    audience: z.enum(['beginners', 'experts']),
    score: z.number().min(0).max(1),
    items: z.array(z.object({ label: z.string() })).min(1),
  });
  const clients: { name: string; model(baseUrl: string): LanguageModel; asked: string }[] = [
    {
      name: 'openai-compatible',
      model: (baseURL) =>
        createOpenAICompatible({ name: 'demo', baseURL, apiKey: 'test', supportsStructuredOutputs: true })(
          'stand-in',
        ),
      asked: 'response_format',
    },
    {
      name: 'anthropic, structured outputs',
      model: (baseURL) => createAnthropic({ baseURL, apiKey: 'test' })('claude-haiku-4-5'),
      asked: 'output_config',
    },
    {
      name: 'anthropic, the json tool',
      model: (baseURL) => createAnthropic({ baseURL, apiKey: 'test' })('claude-3-haiku-20240307'),
      asked: 'tools',
    },
  ];
  for (const client of clients) {
    it(`through ${client.name}`, async () => {
      const server = await demoServer();
      const result = await generateText({
        model: client.model(server.baseUrl),
        prompt: PROMPT,
        output: Output.object({ schema: NewAnswerSchema, name: 'headline' }),
        headers: { 'x-pipeline-step': 'headline' },
        maxRetries: 0,
      });
      assert.deepEqual(result.output, NEW_ANSWER);
      const [request] = server.requests;
      assert.equal(request?.step, 'headline');
      assert.ok(
        typeof request.body === 'object' && request.body !== null && client.asked in request.body,
        `the client did not ask by ${client.asked}: ${JSON.stringify(request.body)}`,
      );
    });
  }
});
