import { ApplicationFailure } from '@temporalio/common';
import {
  APICallError,
  EmptyResponseBodyError,
  generateText,
  InvalidResponseDataError,
  jsonSchema,
  NoObjectGeneratedError,
  Output,
  tool,
} from 'ai';
import type { FinishReason, JSONValue, LanguageModel, LanguageModelUsage, ModelMessage, TextPart } from 'ai';

import { z } from 'zod';
import {
  describeCauses,
  excerpt,
  isRetryableStatus,
  retryAfterOf,
  retryAfterWords,
  transientStatusFailure,
} from '../lib/http';
import { describeIssues, FailureType } from '../contract';
import type { ModelInfo, Usage } from '../contract';
import type { RemoteModelSettings } from './choose';
import { NOT_BILLED } from './pacer';
import type { BusyDetails, Pacer } from './pacer';
import { findProvider } from './providers';
import { paidButRefused } from './memo-call';
import { documentBlock, FRAMING_VERSION, MAX_INPUT_CHARS, SYSTEM, taskOf } from './prompt-frame';
import { limitsFromHeaders } from './rate-limit';
import type { ProviderLimits } from './rate-limit';
import type {
  AgentMessage,
  AgentModel,
  AgentReply,
  AgentTurnRequest,
  DocumentModel,
  ModelAnswer,
  ModelCall,
  ModelRequest,
} from './types';
import { utf8Bytes } from './worst-case';

/**
 * A model behind a provider's API, called through the Vercel AI SDK; the provider (one file each, see
 * providers.ts) only builds the SDK's model. Every request carries the step's Idempotency-Key and the activity's
 * abort signal, and the SDK's own retries are off: Temporal retries, under the same key, and counts them. Errors
 * are sorted for Temporal: transient ones (timeouts, resets, 408/429/5xx, cut off or malformed answers) are
 * retryable, with Retry-After honoured; the rest fail at once and say what to fix.
 */
export class AiSdkModel implements DocumentModel, AgentModel {
  readonly info: ModelInfo;
  readonly promptVersion = FRAMING_VERSION;
  private readonly languageModel: LanguageModel;
  /** Names the provider by origin only: a base URL's path may carry a tenant or a token, and messages are kept. */
  private readonly what: string;

  /** Paces this model's calls for the whole fleet; without it (tests, a model built by hand) calls go at once. */
  private readonly pacer: Pacer | undefined;

  constructor(
    private readonly settings: RemoteModelSettings,
    private readonly requestTimeoutMs: number,
    pacing?: (scope: string, info: ModelInfo) => Pacer,
  ) {
    const provider = findProvider(settings.provider);
    if (provider === undefined) throw new Error(`no model provider is called "${settings.provider}"`);
    this.languageModel = provider.languageModel(settings);
    this.info = { provider: settings.provider, model: settings.model };
    const origin = new URL(settings.baseUrl).origin;
    this.what = `${settings.provider} model server at ${origin}`;
    // A provider's limits are per model (and per account, which one address serves).
    this.pacer = pacing?.(`${settings.provider}/${settings.model} at ${origin}`, this.info);
  }

  async ask<T>(request: ModelRequest<T>, text: string, call: ModelCall): Promise<ModelAnswer<T>> {
    const { answer } = request;
    return this.paced(call, this.sizeOf(request, text, call), async () => {
      const settings = this.request(request, call, text);
      if (answer.kind === 'text') {
        const result = await this.sorted(call, () => generateText(settings));
        const paid = this.paid(result);
        return { value: answer.read(result.text.trim()), ...paid };
      }
      const result = await this.sorted(
        call,
        () =>
          generateText({ ...settings, output: Output.object({ schema: answer.schema, name: answer.name }) }),
        shapeOf(answer.schema),
      );
      const paid = this.paid(result);
      return { value: answer.read(result.output), ...paid };
    });
  }

  /**
   * One turn of an agent step through the AI SDK's tool calling: the conversation as the step saved it, the
   * step's tools declared without `execute` (the kit runs each call as an activity of its own, keyed), so the SDK
   * stops after the model's one answer. Paced, keyed and sorted as every call.
   */
  async converse(request: AgentTurnRequest, call: ModelCall): Promise<ModelAnswer<AgentReply>> {
    const sent = JSON.stringify(request.messages);
    // What a turn sends: the system line, the conversation and the tools' declarations, all of it as bytes.
    const declared = JSON.stringify(request.tools);
    const size = {
      promptChars: request.system.length + sent.length + declared.length,
      promptBytes: utf8Bytes(request.system, sent, declared),
      maxOutputTokens: request.maxOutputTokens,
    };
    return this.paced(call, size, async () => {
      const tools = Object.fromEntries(
        request.tools.map((spec) => [
          spec.name,
          tool({ description: spec.description, inputSchema: jsonSchema(spec.inputSchema) }),
        ]),
      );
      const result = await this.sorted(call, () =>
        generateText({
          model: this.languageModel,
          system: request.system,
          messages: request.messages.map(sdkMessage),
          tools,
          temperature: 0,
          maxOutputTokens: request.maxOutputTokens,
          maxRetries: 0,
          abortSignal: call.signal,
          timeout: this.requestTimeoutMs,
          headers: { 'Idempotency-Key': call.idempotencyKey, 'x-pipeline-step': request.step },
        }),
      );
      const usage = usageOf(result.totalUsage);
      this.checkFinish(result.finishReason, result.text, usage);
      const toolCalls = result.toolCalls.map((c) => ({
        callId: c.toolCallId,
        tool: c.toolName,
        input: c.input,
      }));
      if (toolCalls.length === 0 && result.text.trim() === '')
        throw paidButRefused(
          `model ${this.settings.model} answered with neither text nor a tool call`,
          usage,
        );
      return {
        value: { text: result.text, toolCalls },
        usage,
        limits: limitsOf(result.response.headers),
      };
    });
  }

  /** An answer's usage and limit headers, once it is known to be complete and not empty (paid either way). */
  private paid(result: {
    text: string;
    finishReason: FinishReason;
    totalUsage: LanguageModelUsage;
    response: { headers?: Record<string, string> | undefined };
  }): { usage: Usage; limits: ProviderLimits } {
    const usage = usageOf(result.totalUsage);
    this.checkFinish(result.finishReason, result.text, usage);
    if (result.text.trim() === '')
      throw paidButRefused(`model ${this.settings.model} answered with empty content`, usage);
    return { usage, limits: limitsOf(result.response.headers) };
  }

  /**
   * Sends one request through the fleet's pacing (pacer.ts) when the call has its place and the model a pacer:
   * it waits its turn at the provider's limits and the run's budget, and a 429 or an overload takes a new turn
   * instead of failing. Without them (tests, a model built by hand) the request goes at once.
   */
  private async paced<T>(
    call: ModelCall,
    size: { promptChars: number; promptBytes: number; maxOutputTokens: number },
    send: () => Promise<{ value: T; usage: Usage; limits: ProviderLimits }>,
  ): Promise<ModelAnswer<T>> {
    if (this.pacer === undefined || call.pacing === undefined) {
      const { value, usage } = await send();
      return { value, usage };
    }
    return this.pacer.run(
      { ...call.pacing, holdKey: call.idempotencyKey, signal: call.signal },
      { ...size, send },
    );
  }

  /**
   * A step's request by size: the pacing's likelier estimate (the system line, the document as sent, and the
   * task's few hundred characters) and, as bytes, every text it sends: the bound its budget holds (worst-case.ts).
   */
  private sizeOf<T>(request: ModelRequest<T>, text: string, call: ModelCall) {
    const { answer, maxOutputTokens } = request;
    const promptBytes = utf8Bytes(
      SYSTEM,
      documentBlock(text),
      taskOf(request.instructions, maxOutputTokens, call.retryHint),
      ...(answer.kind === 'json'
        ? [answer.name, JSON.stringify(z.toJSONSchema(answer.schema, { io: 'output' }))]
        : []),
    );
    return {
      promptChars: SYSTEM.length + Math.min(text.length, MAX_INPUT_CHARS) + 300,
      promptBytes,
      maxOutputTokens,
    };
  }

  /**
   * The settings every step sends: the system line, then the document, then the step's task, so the steps'
   * requests share everything up to the task. Where the provider caches only what a request marks (Anthropic),
   * the document is a block of its own, marked. A retry of a refused answer (call.retryHint) is not the identical
   * request again: its task quotes the refusal to the model, after the document, which stays cached.
   */
  private request<T>(request: ModelRequest<T>, call: ModelCall, text: string) {
    const { step, instructions: task, maxOutputTokens } = request;
    const document = documentBlock(text);
    const ask = taskOf(task, maxOutputTokens, call.retryHint);
    const content: TextPart[] =
      findProvider(this.settings.provider)?.marksPromptCache === true
        ? [
            {
              type: 'text',
              text: document,
              providerOptions: { anthropic: { cacheControl: { type: 'ephemeral' } } },
            },
            { type: 'text', text: ask },
          ]
        : [{ type: 'text', text: `${document}\n\n${ask}` }];
    const messages: ModelMessage[] = [{ role: 'user', content }];
    return {
      model: this.languageModel,
      system: SYSTEM,
      messages,
      temperature: 0,
      maxOutputTokens,
      // Temporal retries, with backoff, under the step's budget, counting each try against MAX_PROVIDER_ERRORS.
      maxRetries: 0,
      abortSignal: call.signal,
      timeout: this.requestTimeoutMs,
      // The step by name, for servers and proxies that tell requests apart (the tests' model servers do).
      headers: { 'Idempotency-Key': call.idempotencyKey, 'x-pipeline-step': step },
    };
  }

  /** Refusals and cut-off answers the SDK returns as a finish reason rather than an error. */
  private checkFinish(finishReason: FinishReason, text: string, usage: Usage): void {
    if (finishReason === 'content-filter') throw this.refused(text);
    if (finishReason === 'length') throw this.cutOff(usage);
  }

  /** Runs one SDK call, turning what it throws into the failure Temporal should see. */
  private async sorted<T>(call: ModelCall, run: () => Promise<T>, shape?: string): Promise<T> {
    try {
      return await run();
    } catch (err) {
      throw this.failureFor(err, call.signal, shape);
    }
  }

  /** `shape`: the structured answer asked for, as the message quotes it (shapeOf). */
  private failureFor(err: unknown, signal: AbortSignal, shape?: string): unknown {
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
        `model ${this.settings.model} did not answer with ${shape ?? 'the JSON asked for'} (${why}); ` +
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
    if (status === 429 && /insufficient_quota|billing|credit balance/i.test(body)) {
      // Out of money, not out of turns: waiting does not help.
      return ApplicationFailure.create({
        type: FailureType.ModelRejected,
        nonRetryable: true,
        message: `${this.what} answered HTTP 429 for the account's quota: ${excerpt(body)}; add credits or raise the account's quota, then submit the documents again`,
        details: [NOT_BILLED],
      });
    }
    const tooLarge = status === 429 ? tooLargeOf(body) : undefined;
    if (tooLarge !== undefined) {
      // Larger than the limit itself, not than what is left of it: no wait lets it through.
      return ApplicationFailure.create({
        type: FailureType.ModelRejected,
        nonRetryable: true,
        message:
          `${this.what} refused the call as larger than its ${tooLarge.limitName} limit: the call needs ` +
          `${tooLarge.requested}, the limit is ${tooLarge.limit} a minute, ${tooLarge.requested - tooLarge.limit} ` +
          "over; no wait lets it through: shorten the document or lower the step's maxOutputTokens, or raise the " +
          "account's limit",
      });
    }
    if (isBackPressure(status)) return busyFailure(status, headers, body, this.what);
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
      // A request refused as it stands (4xx) was served no answer: nothing billed. Others may have been.
      ...(status >= 400 && status < 500 && status !== 408 ? { details: [NOT_BILLED] } : {}),
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

/**
 * 429 (too many requests) and "overloaded" (503; Anthropic's 529): the provider's push-back, not a fault of the
 * request. The pacing (pacer.ts) takes a new turn for the call; its Retry-After and limit headers ride along.
 */
function isBackPressure(status: number): boolean {
  return status === 429 || status === 503 || status === 529;
}

/**
 * OpenAI's 429 for a request larger than a per-minute limit itself ("Request too large for gpt-4o in organization
 * org-… on tokens per min (TPM): Limit 30000, Requested 36278. …"): which limit, its size and the request's.
 */
function tooLargeOf(body: string): { limitName: string; limit: number; requested: number } | undefined {
  const found = /Request too large for .*? on (.+?): Limit (\d+), Requested (\d+)/.exec(body);
  if (found === null) return undefined;
  return { limitName: found[1] ?? 'rate', limit: Number(found[2]), requested: Number(found[3]) };
}

function busyFailure(status: number, headers: Headers, body: string, what: string): ApplicationFailure {
  const retryAfterMs = retryAfterOf(headers);
  const details: BusyDetails = {
    overloaded: status !== 429,
    ...(retryAfterMs === undefined ? {} : { retryAfterMs }),
    limits: limitsFromHeaders(headers),
  };
  return ApplicationFailure.create({
    type: FailureType.ProviderBusy,
    message:
      `${what} answered HTTP ${status} (${status === 429 ? 'rate limited' : 'overloaded'})` +
      `${retryAfterMs === undefined ? '' : `; Retry-After ${retryAfterWords(retryAfterMs)}`}: ${excerpt(body)}`,
    nextRetryDelay: retryAfterMs,
    details: [details],
  });
}

/**
 * Tokens as the SDK reports them; a provider that sends no usage counts 0. The SDK's inputTokens is every input
 * token for each provider here: OpenAI's prompt_tokens / input_tokens include the cached ones, and the Anthropic
 * client adds cache reads and writes to Anthropic's input_tokens, which counts only the rest. The cache's share
 * is kept apart when there is one, to be priced as the provider prices it.
 */
function usageOf(usage: LanguageModelUsage | undefined): Usage {
  const cached = usage?.inputTokenDetails.cacheReadTokens ?? 0;
  const written = usage?.inputTokenDetails.cacheWriteTokens ?? 0;
  return {
    inputTokens: usage?.inputTokens ?? 0,
    outputTokens: usage?.outputTokens ?? 0,
    ...(cached > 0 ? { cachedInputTokens: cached } : {}),
    ...(written > 0 ? { cacheWriteInputTokens: written } : {}),
  };
}

/** A message of an agent's conversation as the AI SDK sends it, for every provider. */
function sdkMessage(message: AgentMessage): ModelMessage {
  if (message.role === 'user') return { role: 'user', content: message.text };
  if (message.role === 'assistant') {
    return {
      role: 'assistant',
      content: [
        ...(message.text === '' ? [] : [{ type: 'text' as const, text: message.text }]),
        ...message.toolCalls.map((c) => ({
          type: 'tool-call' as const,
          toolCallId: c.callId,
          toolName: c.tool,
          input: c.input,
        })),
      ],
    };
  }
  return {
    role: 'tool',
    content: message.results.map((r) => ({
      type: 'tool-result' as const,
      toolCallId: r.callId,
      toolName: r.tool,
      output: r.isError
        ? {
            type: 'error-text' as const,
            value: typeof r.output === 'string' ? r.output : JSON.stringify(r.output),
          }
        : { type: 'json' as const, value: r.output as JSONValue },
    })),
  };
}

/** What an answer's headers say of the provider's limits (the AI SDK gives them as a record). */
function limitsOf(headers: Record<string, string> | undefined): ProviderLimits {
  return headers === undefined ? {} : limitsFromHeaders(new Headers(headers));
}

/** A structured answer's shape as a message quotes it: `{"tags": [...]}` for an object holding a list. */
function shapeOf(schema: z.ZodType): string {
  if (!(schema instanceof z.ZodObject)) return 'the JSON asked for';
  const fields = Object.entries(schema.shape as Record<string, z.ZodType>).map(
    ([name, field]) => `${JSON.stringify(name)}: ${field instanceof z.ZodArray ? '[...]' : '...'}`,
  );
  return `{${fields.join(', ')}}`;
}
