/**
 * Bulk mode's parts (docs/bulk.md): a batch's model requests go to a provider's batch API, one line each, at half
 * the price, and each answer lands in the memo of paid answers, where the document's own step finds it.
 */
import { createHash } from 'node:crypto';
import type { Usage } from '../contract';
import type { ModelRequest } from '../model/types';

/** The providers whose batch API bulk mode speaks (MODEL=openai:... or anthropic:...). */
export const BULK_PROVIDERS: readonly string[] = ['openai', 'anthropic'];

/** One model request of a bulk submission: which memo entry it answers, and what to ask. */
export interface BulkRequestRecord {
  /**
   * The line's `custom_id`: the step's bulk key, derived from its memo key (the document's workflow ID, the step,
   * the request's hash), in the characters and length both providers accept.
   */
  customId: string;
  memoKey: string;
  workflowId: string;
  step: string;
  requestHash: string;
  textRef: string;
  /** What shapes the answer besides the text (the step's options: maxSentences, maxTags). */
  input: Record<string, unknown>;
  /** Why the last paid answer to this request was refused, quoted back to the model (a next round). */
  retryHint?: string;
  /** The step's identity the request was built under (stored with its answer). */
  identity?: string;
  /** The most it may cost (budget-cut.ts), kept on its claim where the batch has a budget. */
  worst?: WorstCase;
}

/** The most a request (or several) may cost: tokens, and dollars at the batch price. */
export interface WorstCase {
  tokens: number;
  usd: number;
}

/** A line as sent: the record, the step's request, and the document's text. */
export interface BulkLine {
  record: BulkRequestRecord;
  request: ModelRequest<unknown>;
  text: string;
}

/** A provider batch as the provider reports it, in one shape for both. */
export interface ProviderBatchState {
  id: string;
  /** The provider's own word: OpenAI's `validating` ... `completed`, Anthropic's `in_progress` ... `ended`. */
  status: string;
  /** No request of it will change any more: its results (or its errors) can be read. */
  ended: boolean;
  counts: { total: number; succeeded: number; errored: number; pending: number };
  createdAt: string;
}

/** What a provider batch answered for one request. */
export type BulkOutcome =
  /** A usable answer, in the step's shape. */
  | { customId: string; kind: 'answered'; value: unknown; usage: Usage }
  /** A paid answer that was refused (cut off, not the asked-for shape): its tokens count. */
  | { customId: string; kind: 'refused'; usage: Usage; error: string }
  /** No answer: the request failed, or the batch expired or was cancelled before it was run. */
  | { customId: string; kind: 'errored' | 'expired' | 'canceled'; error: string };

/** A provider's batch API, as bulk mode uses it (OpenAI's in openai.ts, Anthropic's in anthropic.ts). */
export interface BulkApi {
  /** The provider's name, as MODEL names it. */
  readonly provider: string;
  /**
   * The most input tokens `line` may be billed: a byte of the request as sent for each (no tokenizer makes a token
   * of less than a byte, whatever the script), and room for what the provider adds around a request.
   */
  worstInputTokens(line: BulkLine): number;
  /** Creates a provider batch of `lines`, marked with `claimKey` where the provider keeps a mark. */
  create(claimKey: string, lines: readonly BulkLine[], signal: AbortSignal): Promise<ProviderBatchState>;
  /**
   * The batch an interrupted attempt may have created for `claimKey` (claimed at `claimedAt`, for the requests
   * `customIds`), if the provider shows one; `taken` are the batches other claims already own.
   */
  find(
    claimKey: string,
    claim: { claimedAt: Date; customIds: ReadonlySet<string>; taken: ReadonlySet<string> },
    signal: AbortSignal,
  ): Promise<ProviderBatchState | undefined>;
  retrieve(batchId: string, signal: AbortSignal): Promise<ProviderBatchState>;
  cancel(batchId: string, signal: AbortSignal): Promise<ProviderBatchState>;
  /** The outcome of each request of an ended batch; `requests` read each answer in its step's shape. */
  results(
    batchId: string,
    requests: ReadonlyMap<string, ModelRequest<unknown>>,
    signal: AbortSignal,
  ): AsyncIterable<BulkOutcome>;
}

/** A request's custom_id: `<step>-` and 40 hex digits of its memo key's hash (both providers take 64 of [A-Za-z0-9_-]). */
export function customIdFor(step: string, memoKey: string): string {
  const safeStep = step.replace(/[^A-Za-z0-9_]/g, '_').slice(0, 20);
  return `${safeStep}-${createHash('sha256').update(memoKey).digest('hex').slice(0, 40)}`;
}
