/**
 * The tests' rate-limited provider (test/provider-limits.ts) does its own arithmetic right, over HTTP: it admits
 * requests at the rate, refuses above it with the exact wait and the headers of each API, refills continuously up
 * to one grain, counts tokens at admission, serves shared prompt prefixes from its cache, and the AI SDK's own
 * clients read its answers. Time is the provider's clock, moved by each test.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { AiSdkModel } from '../src/model/ai-sdk';
import { remoteModel } from '../src/model/choose';
import { findProvider } from '../src/model/providers';
import { cleanupAfterAll } from './scratch';
import { goDuration, startLimitedProvider } from './provider-limits';
import type { LimitedProvider, LimitedProviderOptions } from './provider-limits';
import { summarizeRequest } from './requests';
import { tagRequest } from './requests';

const defer = cleanupAfterAll();
/** The provider's clock starts here, so Anthropic's reset times read as real dates. */
const T0 = Date.parse('2026-01-01T00:00:00Z');

/** A provider on a clock of the test's own: `at(ms)` sets the time, counted from T0. */
async function provider(
  options: Omit<LimitedProviderOptions, 'clock'>,
): Promise<{ provider: LimitedProvider; at(ms: number): void }> {
  let now = T0;
  const started = await startLimitedProvider({ ...options, clock: () => now });
  defer(() => started.close());
  return { provider: started, at: (ms) => void (now = T0 + ms) };
}

interface Answer {
  status: number;
  headers: Headers;
  body: unknown;
}

/**
 * A summarize step's chat completion request, as the pipeline sends one (x-pipeline-step names the step), with a
 * user message of `chars` characters (chars/4 prompt tokens).
 */
async function chat(
  provider: LimitedProvider,
  {
    chars = 40,
    text,
    maxTokens,
    key,
  }: { chars?: number; text?: string; maxTokens?: number; key?: string } = {},
): Promise<Answer> {
  const content = text ?? `${'Rust has ownership. '.repeat(Math.ceil(chars / 20))}`.slice(0, chars);
  const response = await fetch(`${provider.baseUrl}/chat/completions`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      authorization: 'Bearer test',
      'x-pipeline-step': 'summarize',
      ...(key === undefined ? {} : { 'idempotency-key': key }),
    },
    body: JSON.stringify({
      model: 'gpt-4o-mini',
      messages: [{ role: 'user', content }],
      ...(maxTokens === undefined ? {} : { max_tokens: maxTokens }),
    }),
  });
  return { status: response.status, headers: response.headers, body: await response.json() };
}

/** A Messages request as @ai-sdk/anthropic sends one: system and content blocks, max_tokens. */
async function messages(
  provider: LimitedProvider,
  { text = 'Rust has ownership.', maxTokens = 20, cacheControl = false } = {},
): Promise<Answer> {
  const response = await fetch(`${provider.baseUrl}/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': 'test', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({
      model: 'claude-haiku-4-5',
      max_tokens: maxTokens,
      system: [{ type: 'text', text: 'Summarize.' }],
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text, ...(cacheControl ? { cache_control: { type: 'ephemeral' } } : {}) },
            { type: 'text', text: 'In one sentence.' },
          ],
        },
      ],
    }),
  });
  return { status: response.status, headers: response.headers, body: await response.json() };
}

/** The headers whose names start with `prefix`, as a plain object. */
function headersStarting(headers: Headers, prefix: string): Record<string, string> {
  return Object.fromEntries([...headers].filter(([name]) => name.startsWith(prefix)));
}

describe("the rate-limited provider's arithmetic", () => {
  it('writes durations as OpenAI does', () => {
    assert.deepEqual([0, 17, 120, 1000, 2183, 59_999, 360_000, 90_500, 3_600_000].map(goDuration), [
      '0s',
      '17ms',
      '120ms',
      '1s',
      '2.183s',
      '59.999s',
      '6m0s',
      '1m30.5s',
      '1h0m0s',
    ]);
  });

  it('admits requests at the rate and refuses the one above it with the exact wait, as OpenAI does', async () => {
    const { provider: p, at } = await provider({ limits: { rpm: 60, tpm: 1_000_000 } });
    const first = await chat(p, { chars: 400 });
    assert.equal(first.status, 200);
    assert.deepEqual(headersStarting(first.headers, 'x-ratelimit-'), {
      'x-ratelimit-limit-requests': '60',
      'x-ratelimit-remaining-requests': '59',
      'x-ratelimit-reset-requests': '1s',
      'x-ratelimit-limit-tokens': '1000000',
      'x-ratelimit-remaining-tokens': String(1_000_000 - 100),
      // 100 tokens at 1,000,000 a minute come back in 6 ms.
      'x-ratelimit-reset-tokens': '6ms',
    });

    const refused = await chat(p);
    assert.equal(refused.status, 429);
    assert.equal(refused.headers.get('retry-after-ms'), '1000');
    assert.equal(refused.headers.get('retry-after'), '1');
    assert.equal(refused.headers.get('x-ratelimit-remaining-requests'), '59');
    assert.deepEqual(refused.body, {
      error: {
        message:
          'Rate limit reached for gpt-4o-mini in organization org-stand-in on requests per min (RPM): Limit 60, ' +
          'Used 1, Requested 1. Please try again in 1s. Visit https://platform.openai.com/account/rate-limits to ' +
          'learn more.',
        type: 'requests',
        param: null,
        code: 'rate_limit_exceeded',
      },
    });

    at(400);
    const early = await chat(p);
    assert.equal(early.status, 429);
    assert.equal(early.headers.get('retry-after-ms'), '600');
    // Whole seconds, rounded up: never a retry-after of 0 for a wait of 600 ms.
    assert.equal(early.headers.get('retry-after'), '1');
    assert.equal(early.headers.get('x-ratelimit-reset-requests'), '600ms');

    at(1000);
    assert.equal((await chat(p)).status, 200);

    const stats = p.stats();
    assert.deepEqual([stats.answered, stats.refused, stats.overloaded], [2, 2, 0]);
    assert.deepEqual(
      stats.calls.map((c) => [c.status, c.step, c.api]),
      [
        [200, 'summarize', 'chat'],
        [429, 'summarize', 'chat'],
        [429, 'summarize', 'chat'],
        [200, 'summarize', 'chat'],
      ],
    );
  });

  it('refills continuously, and holds no more than one grain of the limit', async () => {
    const { provider: p, at } = await provider({ limits: { rpm: 120, tpm: 1_000_000 } });
    // 120 a minute, a bucket of 2 (one second's worth), one back every 500 ms.
    assert.deepEqual(
      [await chat(p), await chat(p), await chat(p)].map((a) => [
        a.status,
        a.headers.get('x-ratelimit-remaining-requests'),
        a.headers.get('x-ratelimit-reset-requests'),
        a.headers.get('retry-after-ms'),
      ]),
      [
        [200, '119', '500ms', null],
        [200, '118', '1s', null],
        [429, '118', '1s', '500'],
      ],
    );
    at(250);
    const half = await chat(p);
    assert.deepEqual([half.status, half.headers.get('retry-after-ms')], [429, '250']);
    at(500);
    assert.equal((await chat(p)).status, 200);

    // A minute of quiet banks one second's worth, not a minute's.
    at(60_500);
    const after = [await chat(p), await chat(p), await chat(p)];
    assert.deepEqual(
      after.map((a) => a.status),
      [200, 200, 429],
    );
    assert.equal(after[2]?.headers.get('retry-after-ms'), '500');

    // With a grain of a whole minute, the bucket holds the minute's 60 requests.
    const { provider: minute } = await provider({ limits: { rpm: 60, tpm: 1_000_000 }, grainSeconds: 60 });
    const statuses: number[] = [];
    for (let i = 0; i < 61; i++) statuses.push((await chat(minute)).status);
    assert.deepEqual(statuses, [...Array<number>(60).fill(200), 429]);
  });

  it('charges tokens at admission, max_tokens included; one bigger than a grain needs a full bucket', async () => {
    // 6,000 tokens a minute: a bucket of 100, 1 token back every 10 ms.
    const { provider: p, at } = await provider({ limits: { rpm: 6000, tpm: 6000 } });
    const big = await chat(p, { chars: 200, maxTokens: 100 });
    assert.equal(big.status, 200);
    // 50 prompt tokens and 100 it may answer with: the bucket is at -50.
    assert.equal(big.headers.get('x-ratelimit-remaining-tokens'), String(6000 - 150));
    assert.equal(big.headers.get('x-ratelimit-reset-tokens'), '1.5s');

    const small = await chat(p, { chars: 40 });
    assert.equal(small.status, 429);
    // 10 tokens needed, from -50: 60 tokens, 600 ms.
    assert.equal(small.headers.get('retry-after-ms'), '600');
    assert.match(
      JSON.stringify(small.body),
      /on tokens per min \(TPM\): Limit 6000, Used 150, Requested 10\. Please try again in 600ms\./,
    );
    assert.equal((small.body as { error: { type: string } }).error.type, 'tokens');

    at(599);
    assert.equal((await chat(p, { chars: 40 })).status, 429);
    at(600);
    assert.equal((await chat(p, { chars: 40 })).status, 200);
    // No refund: the 100 tokens asked for stay charged, though the answer used fewer.
    assert.deepEqual(
      p.stats().calls.map((c) => c.tokens),
      [150, 0, 0, 10],
    );
  });

  it('refuses a request larger than the whole tokens-a-minute limit with "Request too large", as OpenAI does', async () => {
    const { provider: p } = await provider({ limits: { rpm: 6000, tpm: 6000 } });
    // 5,000 prompt tokens and 2,000 it may answer with: more than the 6,000 a minute, whatever the bucket holds.
    const huge = await chat(p, { chars: 20_000, maxTokens: 2_000 });
    assert.equal(huge.status, 429);
    assert.deepEqual(huge.body, {
      error: {
        message:
          'Request too large for gpt-4o-mini in organization org-stand-in on tokens per min (TPM): Limit 6000, ' +
          'Requested 7000. The input or output tokens must be reduced in order to run successfully. Visit ' +
          'https://platform.openai.com/account/rate-limits to learn more.',
        type: 'tokens',
        param: null,
        code: 'rate_limit_exceeded',
      },
    });
    // Nothing charged: the bucket is full for the next one.
    assert.equal(huge.headers.get('x-ratelimit-remaining-tokens'), '6000');
    assert.equal((await chat(p, { chars: 40 })).status, 200);
  });

  it("counts a fixed window when told: the whole limit at once, its reset the time to the window's end", async () => {
    const { provider: p, at } = await provider({ limits: { rpm: 3, tpm: 6000 }, fixedWindow: true });
    at(600);
    const first = await chat(p);
    assert.equal(first.status, 200);
    assert.equal(first.headers.get('x-ratelimit-remaining-requests'), '2');
    assert.equal(first.headers.get('x-ratelimit-reset-requests'), '59.4s');
    assert.equal((await chat(p)).status, 200);
    assert.equal((await chat(p)).status, 200);
    const fourth = await chat(p);
    assert.equal(fourth.status, 429);
    assert.equal(fourth.headers.get('retry-after-ms'), '59400');
    at(60_000);
    assert.equal((await chat(p)).status, 200);
  });

  it('settles to the real usage after the answer with refund', async () => {
    const { provider: p } = await provider({ limits: { rpm: 6000, tpm: 60_000 }, refund: true });
    const first = await chat(p, { chars: 200, maxTokens: 500 });
    const { completion_tokens: completion } = (first.body as { usage: { completion_tokens: number } }).usage;
    assert.ok(completion > 0 && completion < 500);
    // Charged 550 at admission, settled to 50 + the answer's tokens once it was sent.
    const second = await chat(p, { chars: 40 });
    assert.equal(second.headers.get('x-ratelimit-remaining-tokens'), String(60_000 - (50 + completion) - 10));
    assert.deepEqual(
      p.stats().calls.map((c) => c.tokens),
      [50 + completion, 10 + (p.stats().calls[1]?.completionTokens ?? 0)],
    );
  });

  it('answers the Messages API with its headers, its 429 and its 529, as Anthropic does', async () => {
    const { provider: p, at } = await provider({ limits: { rpm: 60, tpm: 60_000, otpm: 12_000 } });
    const ok = await messages(p, { text: 'x'.repeat(390) });
    assert.equal(ok.status, 200);
    const body = ok.body as {
      type: string;
      content: { type: string; text: string }[];
      usage: Record<string, number>;
    };
    assert.equal(body.type, 'message');
    assert.equal(body.content[0]?.type, 'text');
    // "Summarize." + 390 + "In one sentence." = 416 characters, 104 tokens.
    assert.deepEqual(body.usage, {
      input_tokens: 104,
      output_tokens: Math.ceil((body.content[0]?.text.length ?? 0) / 4),
      cache_read_input_tokens: 0,
      cache_creation_input_tokens: 0,
    });
    assert.deepEqual(headersStarting(ok.headers, 'anthropic-ratelimit-'), {
      'anthropic-ratelimit-requests-limit': '60',
      'anthropic-ratelimit-requests-remaining': '59',
      'anthropic-ratelimit-requests-reset': '2026-01-01T00:00:01Z',
      'anthropic-ratelimit-input-tokens-limit': '60000',
      // Rounded to the nearest thousand, as Anthropic's are.
      'anthropic-ratelimit-input-tokens-remaining': '60000',
      'anthropic-ratelimit-input-tokens-reset': '2026-01-01T00:00:01Z',
      'anthropic-ratelimit-output-tokens-limit': '12000',
      'anthropic-ratelimit-output-tokens-remaining': '12000',
      'anthropic-ratelimit-output-tokens-reset': '2026-01-01T00:00:01Z',
      'anthropic-ratelimit-tokens-limit': '72000',
      'anthropic-ratelimit-tokens-remaining': '72000',
      'anthropic-ratelimit-tokens-reset': '2026-01-01T00:00:01Z',
    });
    assert.equal(ok.headers.get('x-ratelimit-limit-requests'), null);

    at(10);
    const refused = await messages(p);
    assert.equal(refused.status, 429);
    assert.equal(refused.headers.get('retry-after'), '1');
    assert.equal(refused.headers.get('retry-after-ms'), null);
    assert.deepEqual(
      (refused.body as { type: string; error: { type: string } }).type,
      'error',
      JSON.stringify(refused.body),
    );
    assert.equal((refused.body as { error: { type: string } }).error.type, 'rate_limit_error');
    assert.match(
      (refused.body as { error: { message: string } }).error.message,
      /would exceed your organization's rate limit of 60 requests per minute/,
    );

    at(1000);
    p.overloadFor(500);
    const overloaded = await messages(p);
    assert.equal(overloaded.status, 529);
    assert.deepEqual(overloaded.body, {
      type: 'error',
      error: { type: 'overloaded_error', message: 'Overloaded' },
    });
    const chatOverloaded = await chat(p);
    assert.equal(chatOverloaded.status, 503);
    at(1500);
    assert.equal((await messages(p)).status, 200);
    assert.deepEqual([p.stats().answered, p.stats().refused, p.stats().overloaded], [2, 1, 2]);
  });

  it("reserves Anthropic's output tokens from max_tokens and settles them when the answer is sent", async () => {
    // 600 output tokens a minute: a bucket of 10, one back every 100 ms.
    const { provider: p, at } = await provider({ limits: { rpm: 6000, tpm: 600_000, otpm: 600 } });
    const first = await messages(p, { maxTokens: 64_000 });
    assert.equal(first.status, 200);
    const output = (first.body as { usage: { output_tokens: number } }).usage.output_tokens;
    assert.ok(output > 0 && output < 10, `output ${output}`);
    // Settled: the bucket lacks the answer's tokens, not 64,000; the next request needs a full bucket.
    const next = await messages(p, { maxTokens: 64_000 });
    assert.equal(next.status, 429);
    assert.match((next.body as { error: { message: string } }).error.message, /600 output tokens per minute/);
    at(output * 100 - 1);
    assert.equal((await messages(p, { maxTokens: 64_000 })).status, 429);
    at(output * 100);
    assert.equal((await messages(p, { maxTokens: 64_000 })).status, 200);
    assert.equal(p.stats().outputTokens, 2 * output);
  });

  it('serves a shared prefix of 1024 tokens or more from its cache, in steps of 128', async () => {
    const { provider: p } = await provider({ limits: { rpm: 6000, tpm: 6_000_000 } });
    const document = 'Ownership is a set of rules that govern memory. '.repeat(125); // 6,000 characters
    const usage = async (text: string) =>
      ((await chat(p, { text })).body as { usage: { prompt_tokens_details: { cached_tokens: number } } })
        .usage.prompt_tokens_details.cached_tokens;
    assert.equal(await usage(`${document}Summarize it.`), 0);
    // 6,000 shared characters: 1,500 tokens, 1,408 of them in whole steps of 128.
    assert.equal(await usage(`${document}Tag it.`), 1408);
    assert.equal(await usage(`${document.slice(0, 4000)} and something else`), 0);

    // Anthropic caches what a request marks with cache_control, and only that: the first marked one writes it.
    const usageOf = async (cacheControl: boolean) =>
      ((await messages(p, { text: document, cacheControl })).body as { usage: Record<string, number> }).usage;
    const prompt = Math.ceil(('Summarize.'.length + 6000 + 'In one sentence.'.length) / 4);
    assert.equal((await usageOf(false)).cache_read_input_tokens, 0);
    assert.deepEqual(await usageOf(true), {
      input_tokens: 0,
      output_tokens: 12,
      cache_read_input_tokens: 0,
      cache_creation_input_tokens: prompt,
    });
    assert.deepEqual(await usageOf(true), {
      input_tokens: 0,
      output_tokens: 12,
      cache_read_input_tokens: 1408,
      cache_creation_input_tokens: prompt - 1408,
    });
  });

  it('leaves the limit headers out when told, and still says when to retry', async () => {
    const { provider: p } = await provider({ limits: { rpm: 60, tpm: 60_000 }, limitHeaders: false });
    const ok = await chat(p);
    assert.deepEqual(headersStarting(ok.headers, 'x-ratelimit-'), {});
    const refused = await chat(p);
    assert.equal(refused.status, 429);
    assert.deepEqual(headersStarting(refused.headers, 'x-ratelimit-'), {});
    assert.equal(refused.headers.get('retry-after-ms'), '1000');
  });

  it('changes its limits at run time, counts answers paid twice, and says what the limit needs', async () => {
    const { provider: p, at } = await provider({ limits: { rpm: 60, tpm: 60_000 } });
    assert.equal((await chat(p, { key: 'run-1:summarize' })).status, 200);
    at(1000);
    assert.equal((await chat(p, { key: 'run-1:summarize' })).status, 200);
    p.setLimits({ rpm: 120 });
    at(1500);
    const faster = await chat(p, { key: 'run-2:summarize' });
    assert.equal(faster.status, 200);
    assert.equal(faster.headers.get('x-ratelimit-limit-requests'), '120');
    const stats = p.stats();
    assert.deepEqual(stats.paidTwice, ['run-1:summarize']);
    assert.equal(stats.answered, 3);
    assert.equal(p.limitSeconds(240, 0), 120);
    assert.equal(p.limitSeconds(1, 240_000), 240);
    assert.ok(stats.callsPerMinute > 0);
  });
});

describe('the stand-in, as the AI SDK clients see it', () => {
  for (const [provider, model] of [
    ['openai-compatible', 'gpt-4o-mini'],
    ['anthropic', 'claude-haiku-4-5'],
  ] as const) {
    it(`answers ${provider}'s summarize and tag calls in its own API's shape`, async () => {
      const limited = await startLimitedProvider({ limits: { rpm: 6000, tpm: 6_000_000 } });
      defer(() => limited.close());
      const found = findProvider(provider);
      assert.ok(found);
      const client = new AiSdkModel(
        remoteModel(found, { model, baseUrl: limited.baseUrl, apiKey: 'test' }),
        5_000,
      );
      const text =
        '# Ownership\n\nOwnership is how Rust manages memory. Every value has an owner, and borrowing lends it.';
      const call = (step: string) => ({
        idempotencyKey: `run-1:${step}`,
        signal: new AbortController().signal,
      });
      const summary = await client.ask(summarizeRequest(2), text, call('summarize'));
      const tags = await client.ask(tagRequest(3), text, call('tag'));
      assert.match(summary.value.summary, /Ownership is how Rust manages memory\./);
      assert.ok(tags.value.tags.length > 0, JSON.stringify(tags));
      assert.ok(summary.usage.inputTokens > 0 && summary.usage.outputTokens > 0, JSON.stringify(summary));
      assert.deepEqual(
        limited.stats().calls.map((c) => [c.api, c.step, c.status, c.idempotencyKey]),
        [
          [provider === 'anthropic' ? 'messages' : 'chat', 'summarize', 200, 'run-1:summarize'],
          [provider === 'anthropic' ? 'messages' : 'chat', 'tag', 200, 'run-1:tag'],
        ],
      );
    });
  }
});
