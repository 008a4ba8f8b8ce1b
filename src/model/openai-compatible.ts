import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import { excerpt, isRetryableStatus, postJson, transientStatusFailure } from '../lib/http';
import { describeIssues, FailureType } from '../contract';
import type { DocumentModel, ModelAnswer, ModelCall } from './types';

/** Characters of document text sent to the model; longer texts are cut, and the prompt says so. */
const MAX_INPUT_CHARS = 60_000;

const ChatCompletionSchema = z.object({
  choices: z
    .array(
      z.object({
        message: z.object({
          content: z.string().nullish(),
          refusal: z.string().nullish(),
        }),
        finish_reason: z.string().nullish(),
      }),
    )
    .min(1),
  usage: z
    .object({ prompt_tokens: z.number().int().min(0), completion_tokens: z.number().int().min(0) })
    .partial()
    .nullish(),
});

const TagsAnswerSchema = z.object({ tags: z.array(z.string().trim().min(1).max(60)).min(1) });

export interface OpenAICompatibleOptions {
  baseUrl: string;
  model: string;
  apiKey: string | undefined;
  requestTimeoutMs: number;
}

/**
 * A chat model behind the OpenAI chat-completions API (OpenAI, Ollama, vLLM, LM Studio...). Each request carries
 * the step's Idempotency-Key. Errors are sorted for Temporal: transient ones (timeouts, resets, 408/429/5xx,
 * truncated or malformed answers) are retryable, with Retry-After honoured; the rest fail at once and say why.
 */
export class OpenAICompatibleModel implements DocumentModel {
  readonly info;
  private readonly url: string;

  constructor(private readonly options: OpenAICompatibleOptions) {
    this.info = { provider: 'openai-compatible', model: options.model } as const;
    this.url = `${options.baseUrl.replace(/\/+$/, '')}/chat/completions`;
  }

  async summarize(text: string, maxSentences: number, call: ModelCall): Promise<ModelAnswer<string>> {
    const { content, usage } = await this.chat(
      [
        {
          role: 'system',
          content:
            `Summarize the document the user sends in at most ${maxSentences} sentences of plain prose. ` +
            'Answer with the summary only: no preamble, no Markdown.',
        },
        { role: 'user', content: clip(text) },
      ],
      call,
    );
    return { value: content.trim(), usage };
  }

  async tag(text: string, maxTags: number, call: ModelCall): Promise<ModelAnswer<string[]>> {
    const { content, usage } = await this.chat(
      [
        {
          role: 'system',
          content:
            `Give at most ${maxTags} topic tags for the document the user sends. Answer with JSON only, ` +
            'exactly of the form {"tags": ["tag one", "tag two"]}: short lowercase tags, most relevant first.',
        },
        { role: 'user', content: clip(text) },
      ],
      call,
    );
    const parsed = TagsAnswerSchema.safeParse(parseJsonLoosely(content));
    if (!parsed.success) {
      throw ApplicationFailure.create({
        type: FailureType.ModelOutputInvalid,
        message:
          `model ${this.options.model} did not answer with {"tags": [...]} (${describeIssues(parsed.error)}); ` +
          `its answer began: ${excerpt(content, 120)}`,
      });
    }
    const tags = [...new Set(parsed.data.tags.map((t) => t.toLowerCase()))].slice(0, maxTags);
    return { value: tags, usage };
  }

  private async chat(
    messages: { role: 'system' | 'user'; content: string }[],
    call: ModelCall,
  ): Promise<{ content: string; usage: { inputTokens: number; outputTokens: number } }> {
    const what = `model server at ${this.url}`;
    const headers: Record<string, string> = { 'idempotency-key': call.idempotencyKey };
    if (this.options.apiKey !== undefined) headers.authorization = `Bearer ${this.options.apiKey}`;
    const answer = await postJson(
      this.url,
      { model: this.options.model, messages, temperature: 0 },
      {
        headers,
        timeoutMs: this.options.requestTimeoutMs,
        signal: call.signal,
        what,
        transientType: FailureType.TransientModelError,
      },
    );
    if (isRetryableStatus(answer.status))
      throw transientStatusFailure(answer, what, FailureType.TransientModelError);
    if (answer.status < 200 || answer.status >= 300) {
      const hint =
        answer.status === 401 || answer.status === 403
          ? 'check OPENAI_API_KEY'
          : answer.status === 404
            ? 'check OPENAI_BASE_URL (it should end in /v1) and OPENAI_MODEL'
            : 'check OPENAI_MODEL and the request the server rejects';
      throw ApplicationFailure.create({
        type: FailureType.ModelRejected,
        nonRetryable: true,
        message: `${what} answered HTTP ${answer.status}: ${excerpt(answer.body)}; ${hint}`,
      });
    }
    const completion = ChatCompletionSchema.safeParse(parseJsonLoosely(answer.body));
    if (!completion.success) {
      throw ApplicationFailure.create({
        type: FailureType.ModelOutputInvalid,
        message: `${what} sent a body that is not a chat completion (${describeIssues(completion.error)}): ${excerpt(answer.body, 120)}`,
      });
    }
    const [choice] = completion.data.choices;
    const refusal = choice?.message.refusal;
    if (
      (refusal !== undefined && refusal !== null && refusal !== '') ||
      choice?.finish_reason === 'content_filter'
    ) {
      throw ApplicationFailure.create({
        type: FailureType.ModelRejected,
        nonRetryable: true,
        message: `model ${this.options.model} refused the document: ${refusal ?? 'content filter'}`,
      });
    }
    if (choice?.finish_reason === 'length') {
      throw ApplicationFailure.create({
        type: FailureType.ModelOutputInvalid,
        message: `model ${this.options.model} was cut off (finish_reason "length") before finishing its answer`,
      });
    }
    const content = choice?.message.content ?? '';
    if (content.trim() === '') {
      throw ApplicationFailure.create({
        type: FailureType.ModelOutputInvalid,
        message: `model ${this.options.model} answered with empty content`,
      });
    }
    const usage = completion.data.usage;
    return {
      content,
      usage: { inputTokens: usage?.prompt_tokens ?? 0, outputTokens: usage?.completion_tokens ?? 0 },
    };
  }
}

function clip(text: string): string {
  if (text.length <= MAX_INPUT_CHARS) return text;
  return `${text.slice(0, MAX_INPUT_CHARS)}\n\n[document truncated to its first ${MAX_INPUT_CHARS} characters]`;
}

/** JSON.parse that tolerates a Markdown code fence around the JSON, as chat models often add. */
function parseJsonLoosely(text: string): unknown {
  const unfenced = text
    .trim()
    .replace(/^```(?:json)?\s*/i, '')
    .replace(/\s*```$/, '');
  try {
    return JSON.parse(unfenced);
  } catch {
    return undefined;
  }
}
