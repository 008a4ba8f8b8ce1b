/**
 * A model provider at its rate limits, for the tests: the demo's model server (demo/model-server.ts) with
 * requests and tokens per minute enforced the way OpenAI and Anthropic document it
 * (https://platform.openai.com/docs/guides/rate-limits, https://docs.anthropic.com/en/api/rate-limits):
 *
 * - each limit is a token bucket, refilled continuously at limit/60 a second and holding `limit × grainSeconds / 60`
 *   (both providers: a per-minute limit "may be enforced over shorter periods", 60 RPM as one request a second);
 * - a request is admitted when every bucket holds min(its cost, the bucket's capacity): one bigger than a grain's
 *   worth passes only with a full bucket, and drives it negative; otherwise it gets a 429 saying exactly when it
 *   would be admitted. A refused request costs nothing;
 * - a request's token cost is counted at admission: its prompt's tokens, plus max_tokens when it sends one (OpenAI
 *   counts it at request time and keeps the estimate, unless `refund`). For the Messages API the token limit is
 *   Anthropic's input tokens per minute, which counts no token read from the prompt cache; output tokens per minute
 *   (`otpm`) are reserved from max_tokens and settled to the answer's own count when it is sent;
 * - a chat request whose tokens pass the whole tokens-a-minute limit gets OpenAI's 429 "Request too large for … on
 *   tokens per min (TPM): Limit N, Requested M", at once, charging nothing;
 * - every answer, 2xx or 429, carries the limit headers of its API, with the buckets' state after admission
 *   (`fixedWindow`: each limit counted in fixed one-minute windows instead, its reset the time to the window's end).
 *
 * Tokens are a quarter of the characters, rounded up. A prompt that shares a prefix of 1024 tokens or more with one
 * answered in the last 5 minutes has that prefix served from the cache, in steps of 128 tokens, as OpenAI caches;
 * Anthropic caches only what a request marks with `cache_control`.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import {
  answerBody,
  demoContent,
  errorReply,
  estimateTokens,
  invalidRequest,
  parsedRequest,
  promptText,
  startModelServer,
} from '../demo/model-server';
import type { ChatApi, ChatReply, ChatRequest, ModelServer } from '../demo/model-server';

export interface ProviderLimits {
  /** Requests per minute. */
  rpm: number;
  /**
   * Tokens per minute: OpenAI's TPM (the prompt, plus max_tokens when the request sends it); for the Messages API
   * Anthropic's input tokens per minute (ITPM: the prompt's tokens not read from the cache).
   */
  tpm: number;
  /**
   * Messages API only: Anthropic's output tokens per minute (OTPM). Unset, output is not limited and the
   * output-tokens headers are left out. (The AI SDK asks for claude-haiku-4-5's whole 64,000 output tokens when a
   * call sets no maximum, and each such request needs a full OTPM bucket.)
   */
  otpm?: number;
}

export interface LimitedProviderOptions {
  limits: ProviderLimits;
  /** The seconds' worth of each limit a bucket holds. */
  grainSeconds?: number;
  /** Settles each answered request's tokens to its real usage (prompt and answer), instead of keeping the estimate. */
  refund?: boolean;
  /**
   * Counts each limit in fixed one-minute windows from the server's start instead of a refilling bucket: a window's
   * whole limit may go at once, and its reset headers say when the window ends (59.4 s after its first call, with
   * 59 of 60 left), not when the count would be full again at the rate.
   */
  fixedWindow?: boolean;
  /** Sends the x-ratelimit-* / anthropic-ratelimit-* headers; false plays a provider that sends none. */
  limitHeaders?: boolean;
  /** How long each answer takes. */
  answerDelayMs?: number;
  /** The provider's clock in ms, for a test that moves time itself. */
  clock?: () => number;
}

/** One request as the provider saw it: what it cost, and how it was answered. */
export interface ProviderCall {
  idempotencyKey: string | undefined;
  step: ChatRequest['step'];
  api: ChatApi;
  /** The base URL's first path segment, when it had one (`<origin>/<route>/v1`): whose call it is. */
  route: string | undefined;
  /** Undefined while open, or for a call cut off before its answer. */
  status: number | undefined;
  receivedAt: number;
  answeredAt: number | undefined;
  /** Charged to the token bucket (TPM; for the Messages API, ITPM), settled when it is; 0 unless admitted. */
  tokens: number;
  /** Charged to the output tokens bucket (Messages API with `otpm`), settled when it is. */
  outputTokens: number;
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
  /** For a 429: the limit that refused it. */
  refusedBy: 'requests' | 'tokens' | 'output tokens' | undefined;
}

export interface ProviderStats {
  calls: ProviderCall[];
  /** Answered 2xx. */
  answered: number;
  /** Answered 429. */
  refused: number;
  /** Answered "overloaded": 503 (chat completions), 529 (Messages). */
  overloaded: number;
  /** Idempotency keys answered 2xx more than once: answers paid twice. */
  paidTwice: string[];
  /** From the first request received to the last answer sent; 0 before any answer. */
  wallSeconds: number;
  /** 2xx answers a minute over wallSeconds. */
  callsPerMinute: number;
  /** Tokens charged for the 2xx answers: TPM's (ITPM's for Messages) and OTPM's. */
  tokens: number;
  outputTokens: number;
  /** The time the limits themselves need for the answered calls and their tokens (see limitSeconds). */
  limitSeconds: number;
  /**
   * The longest the provider's own event loop was held up (ms): requests that arrived meanwhile are all admitted
   * at its end, as one burst, which a real provider's machine would have stamped apart.
   */
  longestStallMs: number;
}

export interface LimitedProvider {
  /** For OPENAI_BASE_URL or ANTHROPIC_BASE_URL: one server speaks both APIs. */
  baseUrl: string;
  server: ModelServer;
  /** Changes limits from now on; each bucket keeps what it holds, up to its new capacity. */
  setLimits(limits: Partial<ProviderLimits>): void;
  /** Answers every request "overloaded" (503; Anthropic's 529) for the next `ms`, charging nothing. */
  overloadFor(ms: number): void;
  stats(): ProviderStats;
  /**
   * The time the limits need for `calls` requests of `tokens` tokens (and `outputTokens` under `otpm`), in seconds:
   * max(calls / rpm, tokens / tpm, outputTokens / otpm) minutes.
   */
  limitSeconds(calls: number, tokens: number, outputTokens?: number): number;
  close(): Promise<void>;
}

/** OpenAI caches prompts from 1024 tokens, in steps of 128, for 5 to 10 minutes of inactivity. */
const CACHE = { minTokens: 1024, stepTokens: 128, ttlMs: 5 * 60_000 } as const;
/** Slack for floating-point refills: a bucket this close to a need holds it. */
const EPSILON = 1e-6;

/** Whole milliseconds, rounded up, past the noise of floating-point division. */
const ceilMs = (ms: number): number => Math.ceil(ms - EPSILON);

/** A token bucket: `limit` a minute, refilled continuously, holding at most grainSeconds' worth. */
class Bucket {
  private level: number;
  private at: number;

  constructor(
    private limit: number,
    private readonly grainSeconds: number,
    now: number,
  ) {
    this.level = this.capacity;
    this.at = now;
  }

  get perMinute(): number {
    return this.limit;
  }

  private get capacity(): number {
    return (this.limit * this.grainSeconds) / 60;
  }

  private get perMs(): number {
    return this.limit / 60_000;
  }

  private refill(now: number): void {
    this.level = Math.min(this.capacity, this.level + Math.max(0, now - this.at) * this.perMs);
    this.at = Math.max(this.at, now);
  }

  /** Milliseconds until the bucket holds what a request costing `cost` needs; 0 when it does now. */
  waitMs(cost: number, now: number): number {
    this.refill(now);
    const need = Math.min(cost, this.capacity);
    return this.level + EPSILON >= need ? 0 : (need - this.level) / this.perMs;
  }

  take(cost: number, now: number): void {
    this.refill(now);
    this.level -= cost;
  }

  /** Gives back `tokens` (or takes more, when negative): a settlement after the answer. */
  settle(tokens: number, now: number): void {
    this.refill(now);
    this.level = Math.min(this.capacity, this.level + tokens);
  }

  setLimit(limit: number, now: number): void {
    this.refill(now);
    this.limit = limit;
    this.level = Math.min(this.level, this.capacity);
  }

  /** What is left on the per-minute scale the headers use: the limit less what the bucket lacks. */
  remaining(now: number): number {
    this.refill(now);
    return Math.max(0, Math.floor(this.limit - (this.capacity - this.level)));
  }

  /** Milliseconds until the bucket is full again ("resets to its initial state"). */
  resetMs(now: number): number {
    this.refill(now);
    return ceilMs((this.capacity - this.level) / this.perMs);
  }
}

/** A limit counted in fixed one-minute windows: the whole limit each window, all of it back when the next starts. */
class FixedWindow {
  private used = 0;
  private windowStart: number;

  constructor(
    private limit: number,
    now: number,
  ) {
    this.windowStart = now;
  }

  get perMinute(): number {
    return this.limit;
  }

  private roll(now: number): void {
    if (now < this.windowStart + 60_000) return;
    this.windowStart += Math.floor((now - this.windowStart) / 60_000) * 60_000;
    this.used = 0;
  }

  waitMs(cost: number, now: number): number {
    this.roll(now);
    return this.used + Math.min(cost, this.limit) <= this.limit ? 0 : this.windowStart + 60_000 - now;
  }

  take(cost: number, now: number): void {
    this.roll(now);
    this.used += cost;
  }

  settle(tokens: number, now: number): void {
    this.roll(now);
    this.used = Math.max(0, this.used - tokens);
  }

  setLimit(limit: number, now: number): void {
    this.roll(now);
    this.limit = limit;
  }

  remaining(now: number): number {
    this.roll(now);
    return Math.max(0, this.limit - this.used);
  }

  /** Milliseconds until the window ends, when its count starts again from nothing. */
  resetMs(now: number): number {
    this.roll(now);
    return this.used === 0 ? 0 : ceilMs(this.windowStart + 60_000 - now);
  }
}

/** One limit as the stand-in enforces it. */
type Limiter = Bucket | FixedWindow;

/** A duration the way OpenAI's headers and messages write it (Go's): `120ms`, `1s`, `2.183s`, `6m0s`. */
export function goDuration(ms: number): string {
  const whole = Math.max(0, Math.ceil(ms));
  if (whole === 0) return '0s';
  if (whole < 1000) return `${whole}ms`;
  const hours = Math.floor(whole / 3_600_000);
  const minutes = Math.floor((whole % 3_600_000) / 60_000);
  const seconds = `${(whole % 60_000) / 1000}s`;
  if (hours > 0) return `${hours}h${minutes}m${seconds}`;
  return minutes > 0 ? `${minutes}m${seconds}` : seconds;
}

/** An RFC 3339 time, to the second, rounded up: when an Anthropic limit is fully replenished. */
function rfc3339(ms: number): string {
  return new Date(Math.ceil(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

const nearestThousand = (n: number): number => Math.round(n / 1000) * 1000;

/** The length of the longest prefix `a` and `b` share. */
function sharedPrefix(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  return i;
}

/** Prompts answered lately, and how much of a new prompt they let the provider serve from its cache. */
class PromptCache {
  private readonly seen: { text: string; at: number }[] = [];

  cachedTokens(text: string, now: number): number {
    let longest = 0;
    for (const entry of this.seen)
      if (now - entry.at <= CACHE.ttlMs) longest = Math.max(longest, sharedPrefix(entry.text, text));
    const tokens = Math.floor(longest / 4);
    return tokens < CACHE.minTokens ? 0 : Math.floor(tokens / CACHE.stepTokens) * CACHE.stepTokens;
  }

  remember(text: string, now: number): void {
    const fresh = this.seen.filter((entry) => now - entry.at <= CACHE.ttlMs);
    this.seen.splice(0, this.seen.length, ...fresh, { text, at: now });
  }
}

interface Charge {
  tokens: number;
  outputTokens: number;
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
}

type Reply = Exclude<ChatReply, 'hang'>;

/**
 * Starts the demo's model server behind a provider's rate limits (see the file's comment). Both APIs share the
 * buckets, as one provider key's limits would.
 */
export async function startLimitedProvider({
  limits,
  grainSeconds = 1,
  refund = false,
  fixedWindow = false,
  limitHeaders = true,
  answerDelayMs,
  clock = Date.now,
}: LimitedProviderOptions): Promise<LimitedProvider> {
  let current: ProviderLimits = { ...limits };
  const start = clock();
  const limiter = (limit: number): Limiter =>
    fixedWindow ? new FixedWindow(limit, start) : new Bucket(limit, grainSeconds, start);
  const requests = limiter(limits.rpm);
  const tokens = limiter(limits.tpm);
  const output = limits.otpm === undefined ? undefined : limiter(limits.otpm);
  const cache = new PromptCache();
  const charges = new WeakMap<ChatRequest, Charge>();
  const refusedBy = new WeakMap<ChatRequest, ProviderCall['refusedBy']>();
  const stalls = monitorEventLoopDelay({ resolution: 10 });
  stalls.enable();
  let overloadedUntil = -Infinity;

  /** The limit headers of the request's API, with the buckets as they are now. */
  function headersFor(api: ChatApi, now: number): Record<string, string> {
    if (!limitHeaders) return {};
    if (api === 'chat') {
      const headers: Record<string, string> = {};
      for (const [name, bucket] of [
        ['requests', requests],
        ['tokens', tokens],
      ] as const) {
        headers[`x-ratelimit-limit-${name}`] = String(bucket.perMinute);
        headers[`x-ratelimit-remaining-${name}`] = String(bucket.remaining(now));
        headers[`x-ratelimit-reset-${name}`] = goDuration(bucket.resetMs(now));
      }
      return headers;
    }
    const headers: Record<string, string> = {
      'anthropic-ratelimit-requests-limit': String(requests.perMinute),
      'anthropic-ratelimit-requests-remaining': String(requests.remaining(now)),
      'anthropic-ratelimit-requests-reset': rfc3339(now + requests.resetMs(now)),
    };
    const tokenBuckets = output === undefined ? [tokens] : [tokens, output];
    for (const [name, bucket] of [
      ['input-tokens', tokens],
      ['output-tokens', output],
    ] as const) {
      if (bucket === undefined) continue;
      headers[`anthropic-ratelimit-${name}-limit`] = String(bucket.perMinute);
      headers[`anthropic-ratelimit-${name}-remaining`] = String(nearestThousand(bucket.remaining(now)));
      headers[`anthropic-ratelimit-${name}-reset`] = rfc3339(now + bucket.resetMs(now));
    }
    // With no workspace limit, Anthropic's tokens-* headers are the sum of input and output.
    const sum = (f: (b: Limiter) => number): number => tokenBuckets.reduce((total, b) => total + f(b), 0);
    headers['anthropic-ratelimit-tokens-limit'] = String(sum((b) => b.perMinute));
    headers['anthropic-ratelimit-tokens-remaining'] = String(nearestThousand(sum((b) => b.remaining(now))));
    headers['anthropic-ratelimit-tokens-reset'] = rfc3339(
      now + Math.max(...tokenBuckets.map((b) => b.resetMs(now))),
    );
    return headers;
  }

  function overloaded(api: ChatApi): Reply {
    return api === 'messages'
      ? errorReply(api, 529, { type: 'overloaded_error', message: 'Overloaded' })
      : errorReply(api, 503, { type: 'server_error', message: 'The server is overloaded or not ready yet.' });
  }

  /** The 429 for a request `bucket` refused, admitted in `waitMs`. */
  function refusal(request: ChatRequest, bucket: Limiter, cost: number, waitMs: number, now: number): Reply {
    const model = parsedRequest(request)?.model ?? 'the model';
    const headers = headersFor(request.api, now);
    const retryAfterMs = ceilMs(waitMs);
    const seconds = String(Math.ceil(retryAfterMs / 1000));
    if (request.api === 'messages') {
      const what = bucket === requests ? 'requests' : bucket === tokens ? 'input tokens' : 'output tokens';
      return errorReply(
        'messages',
        429,
        {
          type: 'rate_limit_error',
          message:
            `This request would exceed your organization's rate limit of ${bucket.perMinute} ${what} per minute ` +
            `(org: stand-in, model: ${model}). For details, refer to: https://docs.claude.com/en/api/rate-limits. ` +
            'You can see the response headers for current usage. Please reduce the prompt length or the maximum ' +
            'tokens requested, or try again later.',
        },
        { ...headers, 'retry-after': seconds },
      );
    }
    const kind = bucket === requests ? 'requests' : 'tokens';
    const used = bucket.perMinute - bucket.remaining(now);
    return errorReply(
      'chat',
      429,
      {
        type: kind,
        code: 'rate_limit_exceeded',
        message:
          `Rate limit reached for ${model} in organization org-stand-in on ` +
          `${kind === 'requests' ? 'requests per min (RPM)' : 'tokens per min (TPM)'}: Limit ${bucket.perMinute}, ` +
          `Used ${used}, Requested ${cost}. Please try again in ${goDuration(retryAfterMs)}. ` +
          'Visit https://platform.openai.com/account/rate-limits to learn more.',
      },
      { ...headers, 'retry-after-ms': String(retryAfterMs), 'retry-after': seconds },
    );
  }

  /** OpenAI's 429 for a request larger than the tokens-a-minute limit itself, in its own words. */
  function tooLargeRefusal(request: ChatRequest, cost: number, now: number): Reply {
    const model = parsedRequest(request)?.model ?? 'the model';
    return errorReply(
      'chat',
      429,
      {
        type: 'tokens',
        code: 'rate_limit_exceeded',
        message:
          `Request too large for ${model} in organization org-stand-in on tokens per min (TPM): ` +
          `Limit ${tokens.perMinute}, Requested ${cost}. The input or output tokens must be reduced in order to ` +
          'run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.',
      },
      headersFor('chat', now),
    );
  }

  function answer(request: ChatRequest): ChatReply {
    const now = clock();
    if (now < overloadedUntil) return overloaded(request.api);
    const parsed = parsedRequest(request);
    const content = demoContent(request);
    if (parsed === undefined || content === undefined) return invalidRequest(request.api);

    const text = promptText(request);
    const promptTokens = estimateTokens(text);
    const caches = request.api === 'chat' || JSON.stringify(request.body).includes('"cache_control"');
    const cachedTokens = caches ? cache.cachedTokens(text, now) : 0;
    const costs: [Limiter, number][] =
      request.api === 'chat'
        ? [
            [requests, 1],
            [tokens, promptTokens + (parsed.maxTokens ?? 0)],
          ]
        : [
            [requests, 1],
            [tokens, promptTokens - cachedTokens],
            ...(output === undefined ? [] : [[output, parsed.maxTokens ?? 0] as [Limiter, number]]),
          ];
    // A request whose tokens pass the whole per-minute limit can never be admitted: OpenAI answers it at once with
    // its "Request too large" 429, charging nothing.
    const tooLarge = request.api === 'chat' && (costs[1]?.[1] ?? 0) > tokens.perMinute;
    if (tooLarge) {
      refusedBy.set(request, 'tokens');
      return tooLargeRefusal(request, costs[1]?.[1] ?? 0, now);
    }
    let refused: { bucket: Limiter; cost: number; waitMs: number } | undefined;
    for (const [bucket, cost] of costs) {
      const waitMs = bucket.waitMs(cost, now);
      if (waitMs > 0 && (refused === undefined || waitMs > refused.waitMs))
        refused = { bucket, cost, waitMs };
    }
    if (refused !== undefined) {
      const { bucket } = refused;
      refusedBy.set(
        request,
        bucket === requests ? 'requests' : bucket === tokens ? 'tokens' : 'output tokens',
      );
    }
    if (refused !== undefined) return refusal(request, refused.bucket, refused.cost, refused.waitMs, now);

    for (const [bucket, cost] of costs) bucket.take(cost, now);
    if (caches) cache.remember(text, now);
    const headers = headersFor(request.api, now);

    const completionTokens = estimateTokens(content);
    const charge: Charge = {
      tokens: costs[1]?.[1] ?? 0,
      outputTokens: costs[2]?.[1] ?? 0,
      promptTokens,
      cachedTokens,
      completionTokens,
    };
    charges.set(request, charge);
    // Settled when the answer is sent: Anthropic adjusts its output estimate then; OpenAI keeps its own.
    const settle = (): void => {
      const at = clock();
      if (refund && request.api === 'chat') {
        tokens.settle(charge.tokens - (promptTokens + completionTokens), at);
        charge.tokens = promptTokens + completionTokens;
      }
      if (output !== undefined && request.api === 'messages') {
        output.settle(charge.outputTokens - completionTokens, at);
        charge.outputTokens = completionTokens;
      }
    };
    if (answerDelayMs === undefined || answerDelayMs <= 0) settle();
    else setTimeout(settle, answerDelayMs).unref();

    const cacheCreationInputTokens =
      request.api === 'messages' && caches && promptTokens >= CACHE.minTokens
        ? promptTokens - cachedTokens
        : 0;
    return {
      body: answerBody(request, content, {
        inputTokens: promptTokens,
        outputTokens: completionTokens,
        cachedInputTokens: cachedTokens,
        cacheCreationInputTokens,
      }),
      headers,
      ...(answerDelayMs === undefined ? {} : { delayMs: answerDelayMs }),
    };
  }

  const limitSeconds = (calls: number, tokenCount: number, outputTokens = 0): number =>
    60 *
    Math.max(
      calls / current.rpm,
      tokenCount / current.tpm,
      current.otpm === undefined ? 0 : outputTokens / current.otpm,
    );

  const server = await startModelServer(answer);
  return {
    baseUrl: server.baseUrl,
    server,
    setLimits: (changed) => {
      const now = clock();
      current = { ...current, ...changed };
      requests.setLimit(current.rpm, now);
      tokens.setLimit(current.tpm, now);
      if (output !== undefined && current.otpm !== undefined) output.setLimit(current.otpm, now);
    },
    overloadFor: (ms) => {
      overloadedUntil = clock() + ms;
    },
    stats: () => {
      const calls: ProviderCall[] = server.requests.map((r) => {
        const charge = charges.get(r);
        return {
          idempotencyKey: r.idempotencyKey,
          step: r.step,
          api: r.api,
          route: r.route,
          status: r.status,
          receivedAt: r.receivedAt,
          answeredAt: r.answeredAt,
          tokens: charge?.tokens ?? 0,
          outputTokens: charge?.outputTokens ?? 0,
          promptTokens: charge?.promptTokens ?? 0,
          cachedTokens: charge?.cachedTokens ?? 0,
          completionTokens: charge?.completionTokens ?? 0,
          refusedBy: refusedBy.get(r),
        };
      });
      const answered = calls.filter((c) => c.status !== undefined && c.status >= 200 && c.status < 300);
      const perKey = new Map<string, number>();
      for (const c of answered) {
        const key = c.idempotencyKey ?? '(no key)';
        perKey.set(key, (perKey.get(key) ?? 0) + 1);
      }
      const answeredAt = calls.flatMap((c) => (c.answeredAt === undefined ? [] : [c.answeredAt]));
      const first = Math.min(...calls.map((c) => c.receivedAt));
      const wallSeconds = answeredAt.length === 0 ? 0 : (Math.max(...answeredAt) - first) / 1000;
      const tokenCount = answered.reduce((sum, c) => sum + c.tokens, 0);
      const outputTokens = answered.reduce((sum, c) => sum + c.outputTokens, 0);
      return {
        calls,
        answered: answered.length,
        refused: calls.filter((c) => c.status === 429).length,
        overloaded: calls.filter((c) => c.status === 503 || c.status === 529).length,
        paidTwice: [...perKey].filter(([, n]) => n > 1).map(([key]) => key),
        wallSeconds,
        callsPerMinute: wallSeconds === 0 ? 0 : (answered.length * 60) / wallSeconds,
        tokens: tokenCount,
        outputTokens,
        limitSeconds: limitSeconds(answered.length, tokenCount, outputTokens),
        longestStallMs: stalls.max / 1e6,
      };
    },
    limitSeconds,
    close: () => {
      stalls.disable();
      return server.close();
    },
  };
}
