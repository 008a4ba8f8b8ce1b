import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import { excerpt, isRetryableStatus, postJson, transientStatusFailure } from '../lib/http';
import { describeIssues, FailureType } from '../contract';
import type { Usage } from '../contract';
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
  /** Bump with any change to the prompts below or to the shape of their answers. */
  readonly promptVersion = 'prompts-2';
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
      { maxTokens: 120 * maxSentences + 100 },
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
      { maxTokens: 24 * maxTags + 60, json: true },
    );
    const parsed = TagsAnswerSchema.safeParse(parseJsonLoosely(content));
    if (!parsed.success) {
      throw paidButRefused(
        `model ${this.options.model} did not answer with {"tags": [...]} (${describeIssues(parsed.error)}); ` +
          `its answer began: ${excerpt(content, 120)}`,
        usage,
      );
    }
    const tags = [...new Set(parsed.data.tags.map((t) => t.toLowerCase()))].slice(0, maxTags);
    return { value: tags, usage };
  }

  /**
   * One chat completion. A retry of a refused answer (call.retryHint) is not the identical request again: it quotes
   * the refusal to the model, caps the answer's tokens and, for JSON answers, asks for JSON output mode.
   */
  private async chat(
    messages: { role: 'system' | 'user'; content: string }[],
    call: ModelCall,
    { maxTokens, json = false }: { maxTokens: number; json?: boolean },
  ): Promise<{ content: string; usage: Usage }> {
    // Only the origin: a base URL's path may carry a tenant or a token, and messages land in histories and logs.
    const what = `model server at ${new URL(this.url).origin}`;
    const headers: Record<string, string> = { 'idempotency-key': call.idempotencyKey };
    if (this.options.apiKey !== undefined) headers.authorization = `Bearer ${this.options.apiKey}`;
    const answer = await postJson(
      this.url,
      {
        model: this.options.model,
        messages:
          call.retryHint === undefined
            ? messages
            : [
                ...messages,
                {
                  role: 'system',
                  content:
                    `Your previous answer to this request was refused: ${call.retryHint}. Answer again, ` +
                    `complete and within ${maxTokens} tokens, exactly in the form asked for.`,
                },
              ],
        temperature: 0,
        ...(call.retryHint === undefined ? {} : { max_tokens: maxTokens }),
        ...(call.retryHint !== undefined && json ? { response_format: { type: 'json_object' } } : {}),
      },
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
    const usage: Usage = {
      inputTokens: completion.data.usage?.prompt_tokens ?? 0,
      outputTokens: completion.data.usage?.completion_tokens ?? 0,
    };
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
      throw paidButRefused(
        `model ${this.options.model} was cut off (finish_reason "length") before finishing its answer`,
        usage,
      );
    }
    const content = choice?.message.content ?? '';
    if (content.trim() === '') {
      throw paidButRefused(`model ${this.options.model} answered with empty content`, usage);
    }
    return { content, usage };
  }
}

/** A retryable refusal of an answer the provider was paid for: its usage rides along, so the cost counts it. */
function paidButRefused(message: string, usage: Usage): ApplicationFailure {
  return ApplicationFailure.create({
    type: FailureType.ModelOutputInvalid,
    message,
    details: [{ paidUsage: usage }],
  });
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
