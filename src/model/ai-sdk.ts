import { ApplicationFailure } from '@temporalio/common';
import {
  APICallError,
  EmptyResponseBodyError,
  generateText,
  InvalidResponseDataError,
  NoObjectGeneratedError,
  Output,
} from 'ai';
import type { FinishReason, LanguageModel, LanguageModelUsage } from 'ai';
import { z } from 'zod';
import {
  describeCauses,
  excerpt,
  isRetryableStatus,
  retryAfterOf,
  transientStatusFailure,
} from '../lib/http';
import { describeIssues, FailureType } from '../contract';
import type { ModelInfo, Usage } from '../contract';
import type { RemoteModelSettings } from './choose';
import { findProvider } from './providers';
import type { DocumentModel, ModelAnswer, ModelCall } from './types';

/** Characters of document text sent to the model; longer texts are cut, and the prompt says so. */
const MAX_INPUT_CHARS = 60_000;

/**
 * The tag step's structured output. Lengths are checked by refinements, which stay out of the JSON schema sent
 * to the provider: strict schema modes (OpenAI's, Anthropic's) refuse or drop length keywords, and the answer is
 * validated here anyway.
 */
const TagsAnswerSchema = z.object({
  tags: z
    .array(
      z
        .string()
        .trim()
        .refine((tag) => tag.length > 0, 'must not be empty')
        .refine((tag) => tag.length <= 60, 'must be at most 60 characters'),
    )
    .refine((tags) => tags.length > 0, 'must hold at least one tag')
    .describe('short lowercase topic tags, most relevant first'),
});

/**
 * A model behind a provider's API, called through the Vercel AI SDK; the provider (one file each, see
 * providers.ts) only builds the SDK's model. Every request carries the step's Idempotency-Key and the activity's
 * abort signal, and the SDK's own retries are off: Temporal retries, under the same key, and counts them. Errors
 * are sorted for Temporal: transient ones (timeouts, resets, 408/429/5xx, cut off or malformed answers) are
 * retryable, with Retry-After honoured; the rest fail at once and say what to fix.
 */
export class AiSdkModel implements DocumentModel {
  readonly info: ModelInfo;
  /** Bump with any change to the prompts below or to the shape of their answers. */
  readonly promptVersion = 'prompts-3';
  private readonly languageModel: LanguageModel;
  /** Names the provider by origin only: a base URL's path may carry a tenant or a token, and messages are kept. */
  private readonly what: string;

  constructor(
    private readonly settings: RemoteModelSettings,
    private readonly requestTimeoutMs: number,
  ) {
    const provider = findProvider(settings.provider);
    if (provider === undefined) throw new Error(`no model provider is called "${settings.provider}"`);
    this.languageModel = provider.languageModel(settings);
    this.info = { provider: settings.provider, model: settings.model };
    this.what = `${settings.provider} model server at ${new URL(settings.baseUrl).origin}`;
  }

  async summarize(text: string, maxSentences: number, call: ModelCall): Promise<ModelAnswer<string>> {
    const system =
      `Summarize the document the user sends in at most ${maxSentences} sentences of plain prose. ` +
      'Answer with the summary only: no preamble, no Markdown.';
    const result = await this.sorted(call, () =>
      generateText(this.request(call, system, text, 120 * maxSentences + 100)),
    );
    const usage = usageOf(result.totalUsage);
    this.checkFinish(result.finishReason, result.text, usage);
    const summary = result.text.trim();
    if (summary === '')
      throw paidButRefused(`model ${this.settings.model} answered with empty content`, usage);
    return { value: summary, usage };
  }

  async tag(text: string, maxTags: number, call: ModelCall): Promise<ModelAnswer<string[]>> {
    const system = `Give at most ${maxTags} topic tags for the document the user sends: short lowercase tags, most relevant first.`;
    const result = await this.sorted(call, () =>
      generateText({
        ...this.request(call, system, text, 24 * maxTags + 60),
        output: Output.object({ schema: TagsAnswerSchema, name: 'tags' }),
      }),
    );
    const usage = usageOf(result.totalUsage);
    this.checkFinish(result.finishReason, result.text, usage);
    if (result.text.trim() === '') {
      throw paidButRefused(`model ${this.settings.model} answered with empty content`, usage);
    }
    const tags = [...new Set(result.output.tags.map((t) => t.toLowerCase()))].slice(0, maxTags);
    return { value: tags, usage };
  }

  /**
   * The settings both steps send. A retry of a refused answer (call.retryHint) is not the identical request
   * again: it quotes the refusal to the model and caps the answer's tokens.
   */
  private request(call: ModelCall, system: string, text: string, retryMaxTokens: number) {
    return {
      model: this.languageModel,
      system:
        call.retryHint === undefined
          ? system
          : `${system}\n\nYour previous answer to this request was refused: ${call.retryHint}. Answer again, ` +
            `complete and within ${retryMaxTokens} tokens, exactly in the form asked for.`,
      prompt: clip(text),
      temperature: 0,
      ...(call.retryHint === undefined ? {} : { maxOutputTokens: retryMaxTokens }),
      // Temporal retries, with backoff, under the step's budget, counting each try against MAX_PROVIDER_ERRORS.
      maxRetries: 0,
      abortSignal: call.signal,
      timeout: this.requestTimeoutMs,
      headers: { 'Idempotency-Key': call.idempotencyKey },
    };
  }

  /** Refusals and cut-off answers the SDK returns as a finish reason rather than an error. */
  private checkFinish(finishReason: FinishReason, text: string, usage: Usage): void {
    if (finishReason === 'content-filter') throw this.refused(text);
    if (finishReason === 'length') throw this.cutOff(usage);
  }

  /** Runs one SDK call, turning what it throws into the failure Temporal should see. */
  private async sorted<T>(call: ModelCall, run: () => Promise<T>): Promise<T> {
    try {
      return await run();
    } catch (err) {
      throw this.failureFor(err, call.signal);
    }
  }

  private failureFor(err: unknown, signal: AbortSignal): unknown {
    // Cancelled or timed out by Temporal: the activity's own failure says so.
    if (signal.aborted) return err;
    if (err instanceof Error && (err.name === 'TimeoutError' || err.name === 'AbortError')) {
      return ApplicationFailure.create({
        type: FailureType.TransientModelError,
        message: `${this.what}: no answer within ${this.requestTimeoutMs} ms`,
      });
    }
    if (NoObjectGeneratedError.isInstance(err)) {
      const usage = usageOf(err.usage);
      if (err.finishReason === 'content-filter') return this.refused(err.text ?? '');
      if (err.finishReason === 'length') return this.cutOff(usage);
      const invalid = err.cause instanceof Error ? err.cause.cause : undefined;
      const why = invalid instanceof z.ZodError ? describeIssues(invalid) : 'not JSON';
      return paidButRefused(
        `model ${this.settings.model} did not answer with {"tags": [...]} (${why}); ` +
          `its answer began: ${excerpt(err.text ?? '', 120)}`,
        usage,
      );
    }
    if (APICallError.isInstance(err)) return this.httpFailure(err);
    if (InvalidResponseDataError.isInstance(err) || EmptyResponseBodyError.isInstance(err)) {
      // The provider answered 2xx with something its client could not read (no choices, no body).
      return ApplicationFailure.create({
        type: FailureType.ModelOutputInvalid,
        message: `${this.what} sent an answer its ${this.settings.provider} client could not read: ${err.message}`,
      });
    }
    return err;
  }

  /** One HTTP exchange that failed: no answer, an error status, or a 2xx body that is not the provider's shape. */
  private httpFailure(err: APICallError): ApplicationFailure {
    const status = err.statusCode;
    const body = err.responseBody ?? '';
    if (status === undefined || (status < 300 && err.isRetryable)) {
      // No status, or one whose body broke off: the connection failed (refused, reset, cut short).
      return ApplicationFailure.create({
        type: FailureType.TransientModelError,
        message: `${this.what}: request failed (${describeCauses(err)})`,
      });
    }
    if (status < 300) {
      return ApplicationFailure.create({
        type: FailureType.ModelOutputInvalid,
        message: `${this.what} sent an answer its ${this.settings.provider} client could not read (${err.message}): ${excerpt(body, 120)}`,
      });
    }
    const headers = new Headers(err.responseHeaders);
    if (isRetryableStatus(status)) {
      return transientStatusFailure(
        { status, headers, body, retryAfterMs: retryAfterOf(headers) },
        this.what,
        FailureType.TransientModelError,
      );
    }
    const { variables } = this.settings;
    const hint =
      status === 401 || status === 403
        ? `check ${variables.apiKey}`
        : status === 404
          ? `check ${variables.baseUrl} (it should end in /v1) and ${variables.model}`
          : `check ${variables.model} and the request the server rejects`;
    return ApplicationFailure.create({
      type: FailureType.ModelRejected,
      nonRetryable: true,
      message: `${this.what} answered HTTP ${status}: ${excerpt(body === '' ? err.message : body)}; ${hint}`,
    });
  }

  private refused(text: string): ApplicationFailure {
    return ApplicationFailure.create({
      type: FailureType.ModelRejected,
      nonRetryable: true,
      message: `model ${this.settings.model} refused the document: ${text.trim() === '' ? 'content filter' : text.trim()}`,
    });
  }

  private cutOff(usage: Usage): ApplicationFailure {
    return paidButRefused(
      `model ${this.settings.model} was cut off (finish reason "length") before finishing its answer`,
      usage,
    );
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

/** Tokens as the SDK reports them; a provider that sends no usage counts 0. */
function usageOf(usage: LanguageModelUsage | undefined): Usage {
  return { inputTokens: usage?.inputTokens ?? 0, outputTokens: usage?.outputTokens ?? 0 };
}

function clip(text: string): string {
  if (text.length <= MAX_INPUT_CHARS) return text;
  return `${text.slice(0, MAX_INPUT_CHARS)}\n\n[document truncated to its first ${MAX_INPUT_CHARS} characters]`;
}
