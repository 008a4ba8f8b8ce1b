import Anthropic from '@anthropic-ai/sdk';
import type {
  MessageBatch,
  MessageBatchIndividualResponse,
} from '@anthropic-ai/sdk/resources/messages/batches';
import type { Message, MessageCreateParamsNonStreaming } from '@anthropic-ai/sdk/resources/messages/messages';
import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import { FailureType } from '../contract';
import type { Usage } from '../contract';
import type { RemoteModelSettings } from '../model/choose';
import { documentBlock, SYSTEM, taskOf } from '../model/prompt-frame';
import type { ModelRequest } from '../model/types';
import { sortedCall } from './errors';
import { readAnswer } from './read-answer';
import { FRAMING_TOKENS, utf8Bytes } from '../model/worst-case';
import type { BulkApi, BulkLine, BulkOutcome, ProviderBatchState } from './types';

/** How far back a lookup looks before its claim was made: clocks of the worker and the provider differ. */
const CLOCK_SKEW_MS = 10 * 60_000;

/**
 * Anthropic's Message Batches through its official client: one create call carries every request (custom_id and
 * the Messages API's parameters), and the results come back as JSON lines once the batch has ended, matched by
 * custom_id. A message batch carries no mark of the caller's, so an interrupted attempt's batch is found by what
 * it is: created after the claim (less the clocks' skew) with the claim's number of requests, and owned by no
 * other claim; where several fit, the one whose results hold the claim's custom_ids, once they have ended.
 */
export class AnthropicBulkApi implements BulkApi {
  readonly provider = 'anthropic';
  private readonly client: Anthropic;
  private readonly what: string;

  constructor(private readonly settings: RemoteModelSettings) {
    // The project's ANTHROPIC_BASE_URL ends in /v1 (the AI SDK's form); the official client adds /v1 itself.
    const baseURL = settings.baseUrl.replace(/\/v1\/?$/, '');
    this.client = new Anthropic({ apiKey: settings.apiKey ?? '', baseURL, maxRetries: 2 });
    this.what = `Anthropic Message Batches API at ${new URL(settings.baseUrl).origin}`;
  }

  worstInputTokens(line: BulkLine): number {
    return utf8Bytes(JSON.stringify(this.requestOf(line))) + FRAMING_TOKENS;
  }

  async create(
    _claimKey: string,
    lines: readonly BulkLine[],
    signal: AbortSignal,
  ): Promise<ProviderBatchState> {
    const requests = lines.map((line) => this.requestOf(line));
    // Sent once: the SDK would send it again after a reset or a 5xx, and a message batch takes no idempotency key,
    // so a lost answer would buy a second batch. The caller looks for the batch before it creates again.
    return stateOf(
      await this.call(() => this.client.messages.batches.create({ requests }, { signal, maxRetries: 0 })),
    );
  }

  async find(
    _claimKey: string,
    claim: { claimedAt: Date; customIds: ReadonlySet<string>; taken: ReadonlySet<string> },
    signal: AbortSignal,
  ): Promise<ProviderBatchState | undefined> {
    const oldest = claim.claimedAt.getTime() - CLOCK_SKEW_MS;
    const candidates = await this.call(async () => {
      const found: MessageBatch[] = [];
      // Newest first: the listing stops at the first batch made before the claim (less the clocks' skew).
      for await (const batch of this.client.messages.batches.list({ limit: 100 }, { signal })) {
        if (Date.parse(batch.created_at) < oldest) break;
        if (totalOf(batch) === claim.customIds.size && !claim.taken.has(batch.id)) found.push(batch);
      }
      return found;
    });
    if (candidates.length <= 1) return candidates[0] === undefined ? undefined : stateOf(candidates[0]);
    // Several fit (claims of the same size made in the same minutes): which one is this claim's is told by the
    // custom_ids of its results, which can be read once a batch has ended.
    for (const batch of candidates) {
      if (batch.processing_status !== 'ended') continue;
      const first = await this.firstCustomId(batch.id, signal);
      if (first !== undefined && claim.customIds.has(first)) return stateOf(batch);
    }
    if (candidates.some((b) => b.processing_status !== 'ended'))
      throw ApplicationFailure.create({
        type: FailureType.TransientModelError,
        message:
          `${candidates.length} message batches fit this claim (made since it, of its ${claim.customIds.size} ` +
          'requests); the one that is its own is known by its results once it ends: looking again later',
        nextRetryDelay: '1 minute',
      });
    return undefined;
  }

  /** The custom_id of an ended batch's first result. */
  private async firstCustomId(batchId: string, signal: AbortSignal): Promise<string | undefined> {
    const lines = await this.call(() => this.client.messages.batches.results(batchId, {}, { signal }));
    for await (const line of lines as AsyncIterable<MessageBatchIndividualResponse>) return line.custom_id;
    return undefined;
  }

  async retrieve(batchId: string, signal: AbortSignal): Promise<ProviderBatchState> {
    return stateOf(await this.call(() => this.client.messages.batches.retrieve(batchId, {}, { signal })));
  }

  async cancel(batchId: string, signal: AbortSignal): Promise<ProviderBatchState> {
    return stateOf(await this.call(() => this.client.messages.batches.cancel(batchId, {}, { signal })));
  }

  async *results(
    batchId: string,
    requests: ReadonlyMap<string, ModelRequest<unknown>>,
    signal: AbortSignal,
  ): AsyncIterable<BulkOutcome> {
    const lines = await this.call(() => this.client.messages.batches.results(batchId, {}, { signal }));
    const seen = new Set<string>();
    for await (const line of lines as AsyncIterable<MessageBatchIndividualResponse>) {
      const request = requests.get(line.custom_id);
      if (request === undefined || seen.has(line.custom_id)) continue;
      seen.add(line.custom_id);
      yield this.outcomeOf(line, request);
    }
    for (const customId of requests.keys())
      if (!seen.has(customId))
        yield { customId, kind: 'errored', error: 'the batch ended without a result for it' };
  }

  private outcomeOf(line: MessageBatchIndividualResponse, request: ModelRequest<unknown>): BulkOutcome {
    const customId = line.custom_id;
    const { result } = line;
    if (result.type === 'succeeded') {
      const message: Message = result.message;
      const text = message.content.flatMap((block) => (block.type === 'text' ? [block.text] : [])).join('');
      const end =
        message.stop_reason === 'max_tokens'
          ? 'cut-off'
          : message.stop_reason === 'refusal'
            ? 'refusal'
            : 'complete';
      return readAnswer(customId, request, {
        text,
        end,
        usage: usageOf(message),
        model: this.settings.model,
      });
    }
    if (result.type === 'expired')
      return { customId, kind: 'expired', error: 'the batch expired before it ran' };
    if (result.type === 'canceled') return { customId, kind: 'canceled', error: 'the batch was cancelled' };
    const error = ErrorSchema.safeParse(result.error);
    return {
      customId,
      kind: 'errored',
      error: error.success
        ? `${error.data.error.type}: ${error.data.error.message}`
        : JSON.stringify(result.error),
    };
  }

  /** A request of the batch: its custom_id and the Messages API's parameters. */
  private requestOf({ record, request, text }: BulkLine): {
    custom_id: string;
    params: MessageCreateParamsNonStreaming;
  } {
    return { custom_id: record.customId, params: this.params(request, text, record.retryHint) };
  }

  /** The request, as a direct call frames it (prompt-frame.ts), the document marked for the prompt cache. */
  private params(
    request: ModelRequest<unknown>,
    text: string,
    retryHint?: string,
  ): MessageCreateParamsNonStreaming {
    const { answer, instructions, maxOutputTokens } = request;
    return {
      model: this.settings.model,
      max_tokens: maxOutputTokens,
      system: SYSTEM,
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: documentBlock(text), cache_control: { type: 'ephemeral' } },
            { type: 'text', text: taskOf(instructions, maxOutputTokens, retryHint) },
          ],
        },
      ],
      ...(answer.kind === 'json'
        ? {
            output_config: {
              format: {
                type: 'json_schema',
                schema: z.toJSONSchema(answer.schema, { io: 'output' }) as Record<string, unknown>,
              },
            },
          }
        : {}),
    };
  }

  private call<T>(run: () => Promise<T>): Promise<T> {
    return sortedCall(run, this.what, {
      apiKey: this.settings.variables.apiKey,
      baseUrl: this.settings.variables.baseUrl,
    });
  }
}

const ErrorSchema = z.object({ error: z.object({ type: z.string(), message: z.string() }) });

function totalOf(batch: MessageBatch): number {
  const c = batch.request_counts;
  return c.processing + c.succeeded + c.errored + c.canceled + c.expired;
}

function stateOf(batch: MessageBatch): ProviderBatchState {
  const c = batch.request_counts;
  return {
    id: batch.id,
    status: batch.processing_status,
    ended: batch.processing_status === 'ended',
    counts: {
      total: totalOf(batch),
      succeeded: c.succeeded,
      errored: c.errored + c.expired + c.canceled,
      pending: c.processing,
    },
    createdAt: batch.created_at,
  };
}

/** Anthropic's input_tokens counts only what the cache neither read nor wrote: all three are input. */
function usageOf(message: Message): Usage {
  const cached = message.usage.cache_read_input_tokens ?? 0;
  const written = message.usage.cache_creation_input_tokens ?? 0;
  return {
    inputTokens: message.usage.input_tokens + cached + written,
    outputTokens: message.usage.output_tokens,
    ...(cached > 0 ? { cachedInputTokens: cached } : {}),
    ...(written > 0 ? { cacheWriteInputTokens: written } : {}),
  };
}
