/**
 * The stand-in model's answers to an agent step's turns over HTTP, as OpenAI's chat completions API gives a
 * tool call: the related step's plan (search, file a cross-reference, answer), one call a turn, from the tool
 * messages of the conversation so far; summarize and tag are answered in words.
 */
import { randomUUID } from 'node:crypto';
import type { ChatRequest } from './helpers';

export function plannedTurn(
  request: ChatRequest,
  usage = { prompt_tokens: 200, completion_tokens: 30 },
): { body: unknown } {
  const body = request.body as { messages?: { role: string }[]; tools?: unknown[] } | undefined;
  if (request.step !== 'related') {
    const tags = JSON.stringify(body).includes('tags');
    return { body: chatAnswer(tags ? '{"tags": ["checkpoints"]}' : 'Checkpoints skip finished steps.') };
  }
  const done = (body?.messages ?? []).filter((m) => m.role === 'tool').length;
  const plan: [string, unknown][] = [
    ['search', { query: 'checkpoints idempotency' }],
    ['fileCrossReference', { to: ['other-0'], note: 'shared words' }],
    [
      'answer',
      { related: [{ documentId: 'other-0', title: 'Checkpoints in practice' }], crossReference: 'xref-1' },
    ],
  ];
  const [name, args] = plan[Math.min(done, plan.length - 1)] ?? plan[0]!;
  return {
    body: {
      id: `chatcmpl-${randomUUID()}`,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: 'test-model',
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: null,
            tool_calls: [
              {
                id: `call_${done + 1}`,
                type: 'function',
                function: { name, arguments: JSON.stringify(args) },
              },
            ],
          },
          finish_reason: 'tool_calls',
        },
      ],
      usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens },
    },
  };
}

function chatAnswer(content: string): unknown {
  return {
    id: `chatcmpl-${randomUUID()}`,
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model: 'test-model',
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 100, completion_tokens: 20, total_tokens: 120 },
  };
}
