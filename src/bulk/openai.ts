import OpenAI, { toFile } from 'openai';
import type { Batch } from 'openai/resources/batches';
import type {
  ChatCompletion,
  ChatCompletionCreateParamsNonStreaming,
} from 'openai/resources/chat/completions';
import { z } from 'zod';
import type { Usage } from '../contract';
import { documentBlock, SYSTEM, taskOf } from '../model/prompt-frame';
import type { RemoteModelSettings } from '../model/choose';
import type { ModelRequest } from '../model/types';
import { sortedCall } from './errors';
import { readAnswer } from './read-answer';
import type { AnswerEnd } from './read-answer';
import { FRAMING_TOKENS, utf8Bytes } from '../model/worst-case';
import type { BulkApi, BulkLine, BulkOutcome, ProviderBatchState } from './types';

/** The metadata key that marks a provider batch with the claim it was created for. */
export const CLAIM_METADATA_KEY = 'pipeline_claim';
const ENDPOINT = '/v1/chat/completions';
const ENDED = new Set(['completed', 'failed', 'expired', 'cancelled']);
/** How far back a lookup lists batches before its claim was made: clocks of the worker and the provider differ. */
const CLOCK_SKEW_S = 600;
/**
 * A create is sent once: the SDK would send it again after a reset or a 5xx, and the API takes no idempotency key,
 * so a lost answer would buy a second batch. The caller looks for the batch before it creates again (create-once.ts).
 */
const SENT_ONCE = { maxRetries: 0 } as const;

/**
 * OpenAI's Batch API through its official client: the lines go up as a JSONL file (purpose `batch`), the batch
 * is created on /v1/chat/completions with a 24 h window and the claim's key in its metadata, and the answers come
 * back as an output file (and the failures as an error file), matched by custom_id. The upload and the create are
 * sent once each (no SDK retries); an interrupted attempt's batch (or one whose create's answer was lost) is found by
 * listing the account's batches, newest first, back to the claim's time, for that metadata.
 */
export class OpenAiBulkApi implements BulkApi {
  readonly provider = 'openai';
  private readonly client: OpenAI;
  private readonly what: string;

  constructor(private readonly settings: RemoteModelSettings) {
    this.client = new OpenAI({ apiKey: settings.apiKey ?? '', baseURL: settings.baseUrl, maxRetries: 2 });
    this.what = `OpenAI Batch API at ${new URL(settings.baseUrl).origin}`;
  }

  worstInputTokens(line: BulkLine): number {
    return utf8Bytes(this.lineOf(line)) + FRAMING_TOKENS;
  }

  async create(
    claimKey: string,
    lines: readonly BulkLine[],
    signal: AbortSignal,
  ): Promise<ProviderBatchState> {
    const jsonl = lines.map((line) => this.lineOf(line)).join('\n');
    const file = await this.call(async () =>
      this.client.files.create(
        {
          file: await toFile(Buffer.from(`${jsonl}\n`), `${claimKey.replace(/[^\w-]/g, '_')}.jsonl`),
          purpose: 'batch',
        },
        { signal, ...SENT_ONCE },
      ),
    );
    const batch = await this.call(() =>
      this.client.batches.create(
        {
          input_file_id: file.id,
          endpoint: ENDPOINT,
          completion_window: '24h',
          metadata: { [CLAIM_METADATA_KEY]: claimKey },
        },
        { signal, ...SENT_ONCE },
      ),
    );
    return stateOf(batch);
  }

  async find(
    claimKey: string,
    claim: { claimedAt: Date; customIds: ReadonlySet<string>; taken: ReadonlySet<string> },
    signal: AbortSignal,
  ): Promise<ProviderBatchState | undefined> {
    const oldest = claim.claimedAt.getTime() / 1000 - CLOCK_SKEW_S;
    return this.call(async () => {
      // Newest first: stop at the first batch made before the claim was.
      for await (const batch of this.client.batches.list({ limit: 100 }, { signal })) {
        if (batch.created_at < oldest) return undefined;
        if (batch.metadata?.[CLAIM_METADATA_KEY] === claimKey && !claim.taken.has(batch.id))
          return stateOf(batch);
      }
      return undefined;
    });
  }

  async retrieve(batchId: string, signal: AbortSignal): Promise<ProviderBatchState> {
    return stateOf(await this.call(() => this.client.batches.retrieve(batchId, { signal })));
  }

  async cancel(batchId: string, signal: AbortSignal): Promise<ProviderBatchState> {
    return stateOf(await this.call(() => this.client.batches.cancel(batchId, { signal })));
  }

  async *results(
    batchId: string,
    requests: ReadonlyMap<string, ModelRequest<unknown>>,
    signal: AbortSignal,
  ): AsyncIterable<BulkOutcome> {
    const batch = await this.call(() => this.client.batches.retrieve(batchId, { signal }));
    const seen = new Set<string>();
    for (const fileId of [batch.output_file_id, batch.error_file_id]) {
      if (fileId === undefined || fileId === null || fileId === '') continue;
      const body = await this.call(async () => (await this.client.files.content(fileId, { signal })).text());
      for (const raw of body.split('\n')) {
        if (raw.trim() === '') continue;
        const line = OutputLineSchema.parse(JSON.parse(raw));
        const request = requests.get(line.custom_id);
        if (request === undefined || seen.has(line.custom_id)) continue;
        seen.add(line.custom_id);
        yield this.outcomeOf(line, request);
      }
    }
    // A request in neither file (a batch that failed as a whole, or cancelled before it ran): no answer.
    for (const customId of requests.keys()) if (!seen.has(customId)) yield missing(customId, batch.status);
  }

  private outcomeOf(line: OutputLine, request: ModelRequest<unknown>): BulkOutcome {
    const customId = line.custom_id;
    const response = line.response;
    if (response !== null && response !== undefined && response.status_code === 200) {
      const completion = response.body as ChatCompletion;
      const choice = completion.choices[0];
      const end: AnswerEnd =
        choice?.finish_reason === 'length'
          ? 'cut-off'
          : choice?.finish_reason === 'content_filter' || (choice?.message.refusal ?? null) !== null
            ? 'refusal'
            : 'complete';
      const text = end === 'refusal' ? (choice?.message.refusal ?? '') : (choice?.message.content ?? '');
      return readAnswer(customId, request, {
        text,
        end,
        usage: usageOf(completion),
        model: this.settings.model,
      });
    }
    const code = line.error?.code ?? '';
    if (code === 'batch_expired')
      return { customId, kind: 'expired', error: 'the batch expired before it ran' };
    if (code === 'batch_cancelled') return { customId, kind: 'canceled', error: 'the batch was cancelled' };
    const message = line.error?.message ?? JSON.stringify(response?.body ?? {}).slice(0, 300);
    return {
      customId,
      kind: 'errored',
      error: `HTTP ${response?.status_code ?? 'none'}: ${message}`,
    };
  }

  /** A line of the batch's input file. */
  private lineOf({ record, request, text }: BulkLine): string {
    return JSON.stringify({
      custom_id: record.customId,
      method: 'POST',
      url: ENDPOINT,
      body: this.body(request, text, record.retryHint),
    });
  }

  /** The request, as a direct call frames it (prompt-frame.ts): system line, document, task. */
  private body(
    request: ModelRequest<unknown>,
    text: string,
    retryHint?: string,
  ): ChatCompletionCreateParamsNonStreaming {
    const { answer, instructions, maxOutputTokens } = request;
    return {
      model: this.settings.model,
      messages: [
        { role: 'system', content: SYSTEM },
        {
          role: 'user',
          content: `${documentBlock(text)}\n\n${taskOf(instructions, maxOutputTokens, retryHint)}`,
        },
      ],
      temperature: 0,
      max_completion_tokens: maxOutputTokens,
      ...(answer.kind === 'json'
        ? {
            response_format: {
              type: 'json_schema',
              json_schema: {
                name: answer.name,
                strict: true,
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

/** A line of an output or error file, as OpenAI documents it. */
const OutputLineSchema = z.object({
  custom_id: z.string(),
  response: z.object({ status_code: z.number(), body: z.unknown() }).nullable().optional(),
  error: z
    .object({ code: z.string().nullish(), message: z.string().nullish() })
    .nullable()
    .optional()
    .transform((e) =>
      e === null || e === undefined
        ? undefined
        : { code: e.code ?? undefined, message: e.message ?? undefined },
    ),
});
type OutputLine = z.infer<typeof OutputLineSchema>;

function stateOf(batch: Batch): ProviderBatchState {
  const counts = batch.request_counts ?? { total: 0, completed: 0, failed: 0 };
  return {
    id: batch.id,
    status: batch.status,
    ended: ENDED.has(batch.status),
    counts: {
      total: counts.total,
      succeeded: counts.completed,
      errored: counts.failed,
      pending: Math.max(0, counts.total - counts.completed - counts.failed),
    },
    createdAt: new Date(batch.created_at * 1000).toISOString(),
  };
}

function usageOf(completion: ChatCompletion): Usage {
  const cached = completion.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  return {
    inputTokens: completion.usage?.prompt_tokens ?? 0,
    outputTokens: completion.usage?.completion_tokens ?? 0,
    ...(cached > 0 ? { cachedInputTokens: cached } : {}),
  };
}

function missing(customId: string, status: string): BulkOutcome {
  if (status === 'expired') return { customId, kind: 'expired', error: 'the batch expired before it ran' };
  if (status === 'cancelled') return { customId, kind: 'canceled', error: 'the batch was cancelled' };
  return { customId, kind: 'errored', error: `the batch ${status} without an answer to it` };
}
