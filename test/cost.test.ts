/** Cost accounting: tokens from the provider's usage fields, priced from the table, counted once per step. */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describe, it } from 'node:test';
import { MockActivityEnvironment } from '@temporalio/testing';
import { pipelineActivities } from '../src/cli/compose';
import { describeUsage, printOutcomes } from '../src/runs/result-table';
import type { DocumentOutcome } from '../src/runs/result-table';
import { publishedOutcome } from './outcomes';
import { loadConfig } from '../src/config';
import { DEFAULT_PRICES, estimateCost, formatCost, totalUsage } from '../src/model/pricing';
import { UsageSchema } from '../src/contract';
import type { Usage } from '../src/contract';
import type { SummarizeResult } from './requests';
import type { TagResult } from './requests';
import { genAiUsageAttributes } from '../src/telemetry/spans';
import {
  completion,
  isTagRequest,
  modelServerFor,
  openAIModel,
  pipelineInput,
  SAMPLE_TEXT,
  tempParts,
} from './helpers';
import { cleanupAfterAll } from './scratch';
import type { LocalParts, ModelServer } from './helpers';

const defer = cleanupAfterAll();

describe('price table', () => {
  it('prices tokens per million, makes the offline model free, and says n/a without a price', () => {
    const usage = { inputTokens: 2_000_000, outputTokens: 500_000 };
    assert.equal(
      estimateCost(DEFAULT_PRICES, { provider: 'openai-compatible', model: 'gpt-4o-mini' }, usage),
      0.6,
    );
    assert.equal(
      estimateCost(DEFAULT_PRICES, { provider: 'anthropic', model: 'claude-haiku-4-5' }, usage),
      4.5,
    );
    assert.equal(estimateCost({}, { provider: 'offline', model: 'extractive-wink-nlp' }, usage), 0);
    assert.equal(estimateCost({}, { provider: 'openai-compatible', model: 'my-local-llm' }, usage), null);
    assert.equal(formatCost(null), 'n/a');
    assert.equal(formatCost(0.00021), '$0.000210');
  });

  it("prices the prompt cache's share of the input at the provider's cache rates, the rest at the input price", () => {
    const openai = { provider: 'openai', model: 'gpt-4.1' };
    const anthropic = { provider: 'anthropic', model: 'claude-sonnet-4-5' };
    const near = (actual: number | null, expected: number) =>
      assert.ok(actual !== null && Math.abs(actual - expected) < 1e-12, `${actual} is not ${expected}`);
    // gpt-4.1: $2 input, $0.50 cached input, $8 output per million.
    near(
      estimateCost(DEFAULT_PRICES, openai, {
        inputTokens: 1_000_000,
        cachedInputTokens: 800_000,
        outputTokens: 100_000,
      }),
      0.2 * 2 + 0.8 * 0.5 + 0.1 * 8,
    );
    // claude-sonnet-4-5: $3 input, reads 0.1x ($0.30), 5-minute writes 1.25x ($3.75), $15 output.
    near(
      estimateCost(DEFAULT_PRICES, anthropic, {
        inputTokens: 1_000_000,
        cachedInputTokens: 500_000,
        cacheWriteInputTokens: 400_000,
        outputTokens: 0,
      }),
      0.1 * 3 + 0.5 * 0.3 + 0.4 * 3.75,
    );
    // Without cache prices, cached and written tokens cost what other input tokens cost.
    const plain = { 'my-model': { inputPerMillion: 2, outputPerMillion: 4 } };
    const mine = { provider: 'openai-compatible', model: 'my-model' };
    near(
      estimateCost(plain, mine, {
        inputTokens: 1_000_000,
        cachedInputTokens: 600_000,
        cacheWriteInputTokens: 100_000,
        outputTokens: 0,
      }),
      2,
    );
    // A usage without the cache's share (recorded before it was kept) is priced as before.
    near(estimateCost(DEFAULT_PRICES, openai, { inputTokens: 1_000_000, outputTokens: 0 }), 2);
  });

  it("lists each provider's cache prices: OpenAI's cached input, Anthropic's reads at 0.1x and writes at 1.25x", () => {
    assert.deepEqual(
      Object.fromEntries(
        Object.entries(DEFAULT_PRICES).map(([model, p]) => [
          model,
          [p.cachedInputPerMillion, p.cacheWritePerMillion],
        ]),
      ),
      {
        'gpt-4o-mini': [0.075, undefined],
        'gpt-4o': [1.25, undefined],
        'gpt-4.1-mini': [0.1, undefined],
        'gpt-4.1': [0.5, undefined],
        'claude-haiku-4-5': [0.1, 1.25],
        'claude-sonnet-4-5': [0.3, 3.75],
      },
    );
  });

  it('reads usage recorded before the cache fields, and adds the cache fields up where they are', () => {
    assert.deepEqual(UsageSchema.parse({ inputTokens: 5, outputTokens: 1 }), {
      inputTokens: 5,
      outputTokens: 1,
    });
    const steps: { usage: Usage; rejectedUsage?: Usage; estimatedCostUsd: number }[] = [
      { usage: { inputTokens: 1_000, outputTokens: 10, cachedInputTokens: 900 }, estimatedCostUsd: 0.25 },
      {
        usage: { inputTokens: 1_000, outputTokens: 20, cacheWriteInputTokens: 800 },
        rejectedUsage: { inputTokens: 1_000, outputTokens: 5, cachedInputTokens: 800 },
        estimatedCostUsd: 0.5,
      },
    ];
    assert.deepEqual(totalUsage(steps), {
      inputTokens: 3_000,
      outputTokens: 35,
      cachedInputTokens: 1_700,
      cacheWriteInputTokens: 800,
      costUsd: 0.75,
    });
    assert.equal(describeUsage(steps), '3000 (1700 cached)/35 tok, $0.750000');
    assert.equal(
      describeUsage([{ usage: { inputTokens: 3, outputTokens: 1 }, estimatedCostUsd: 0 }]),
      '3/1 tok, $0.000000',
    );
  });

  it("gives a model call's span the GenAI usage attributes and the cost, the cache's share only when reported", () => {
    assert.deepEqual(genAiUsageAttributes({ inputTokens: 1_000, outputTokens: 50 }, null), {
      'gen_ai.operation.name': 'chat',
      'gen_ai.usage.input_tokens': 1_000,
      'gen_ai.usage.output_tokens': 50,
    });
    assert.deepEqual(
      genAiUsageAttributes(
        { inputTokens: 1_000, outputTokens: 50, cachedInputTokens: 600, cacheWriteInputTokens: 300 },
        0.0012,
      ),
      {
        'gen_ai.operation.name': 'chat',
        'gen_ai.usage.input_tokens': 1_000,
        'gen_ai.usage.output_tokens': 50,
        'gen_ai.usage.cache_read.input_tokens': 600,
        'gen_ai.usage.cache_creation.input_tokens': 300,
        'pipeline.cost_usd': 0.0012,
      },
    );
  });

  it('takes extra and overriding prices from MODEL_PRICES', () => {
    const config = loadConfig({
      MODEL_PRICES:
        '{"my-local-llm": {"inputPerMillion": 0, "outputPerMillion": 0}, "gpt-4o-mini": {"inputPerMillion": 1, "outputPerMillion": 1}}',
    });
    assert.deepEqual(config.prices['my-local-llm'], { inputPerMillion: 0, outputPerMillion: 0 });
    assert.deepEqual(config.prices['gpt-4o-mini'], { inputPerMillion: 1, outputPerMillion: 1 });
    assert.ok(config.prices['gpt-4o'], 'the defaults stay for models MODEL_PRICES does not name');
    const cached = loadConfig({
      MODEL_PRICES:
        '{"my-llm": {"inputPerMillion": 3, "outputPerMillion": 15, "cachedInputPerMillion": 0.3, "cacheWritePerMillion": 3.75}}',
    });
    assert.deepEqual(cached.prices['my-llm'], {
      inputPerMillion: 3,
      outputPerMillion: 15,
      cachedInputPerMillion: 0.3,
      cacheWritePerMillion: 3.75,
    });
  });
});

describe('model steps record usage and cost', () => {
  let server: ModelServer;

  async function runStep(
    step: 'summarize' | 'tag',
    runId: string,
    parts: LocalParts,
    textRef: string,
  ): Promise<SummarizeResult | TagResult> {
    const env = new MockActivityEnvironment({
      activityId: step,
      workflowExecution: { workflowId: 'wf', runId },
    });
    const activities = pipelineActivities(parts.deps);
    return step === 'summarize'
      ? env.run(activities.summarize, { documentId: 'doc-1', textRef, maxSentences: 2 })
      : env.run(activities.tag, { documentId: 'doc-1', textRef, maxTags: 3 });
  }

  it('takes tokens from the usage fields, prices them, and does not count a memoised answer twice', async () => {
    server = await modelServerFor(defer, (request) =>
      isTagRequest(request)
        ? { body: completion('{"tags": ["checkpoints"]}', { prompt_tokens: 1_000, completion_tokens: 10 }) }
        : { body: completion('A summary.', { prompt_tokens: 1_000, completion_tokens: 100 }) },
    );
    const parts = await tempParts(defer, {
      model: openAIModel(server, { model: 'gpt-4o-mini', apiKey: undefined }),
    });
    parts.deps.prices = DEFAULT_PRICES;
    const { textRef } = await pipelineInput(parts.blobs, SAMPLE_TEXT);
    const runId = randomUUID();

    const summary = await runStep('summarize', runId, parts, textRef);
    assert.deepEqual(summary.usage, { inputTokens: 1_000, outputTokens: 100 });
    assert.ok(Math.abs((summary.estimatedCostUsd ?? -1) - 0.00021) < 1e-12);

    // The same step again (a retry after a crash): the memoised answer, with the usage of the one paid call.
    const retried = await runStep('summarize', runId, parts, textRef);
    assert.equal(retried.memoised, true);
    assert.deepEqual(retried.usage, summary.usage);
    assert.equal(server.requests.length, 1, 'the retry called the model again');

    const tags = await runStep('tag', runId, parts, textRef);
    // A run's results hold each step once: the total is one summarize call plus one tag call.
    assert.equal(describeUsage([retried, tags]), '2000/110 tok, $0.000366');
  });

  it("records the prompt cache's share of a step's input and prices it at the cached rate", async () => {
    const cachedServer = await modelServerFor(defer, () => ({
      body: {
        choices: [{ index: 0, message: { role: 'assistant', content: 'A summary.' }, finish_reason: 'stop' }],
        usage: {
          prompt_tokens: 2_000,
          completion_tokens: 100,
          prompt_tokens_details: { cached_tokens: 1_536 },
        },
      },
    }));
    const parts = await tempParts(defer, {
      model: openAIModel(cachedServer, { model: 'gpt-4o-mini', apiKey: undefined }),
    });
    parts.deps.prices = DEFAULT_PRICES;
    const { textRef } = await pipelineInput(parts.blobs, SAMPLE_TEXT);
    const summary = await runStep('summarize', randomUUID(), parts, textRef);
    assert.deepEqual(summary.usage, { inputTokens: 2_000, outputTokens: 100, cachedInputTokens: 1_536 });
    // 464 input tokens at $0.15 a million, 1536 cached at $0.075, 100 output at $0.60.
    const expected = (464 * 0.15 + 1_536 * 0.075 + 100 * 0.6) / 1_000_000;
    assert.ok(Math.abs((summary.estimatedCostUsd ?? -1) - expected) < 1e-12, `${summary.estimatedCostUsd}`);
    assert.equal(describeUsage([summary]), '2000 (1536 cached)/100 tok, $0.000245');
  });

  it('shows n/a for a model without a price instead of guessing', () => {
    const step = {
      summary: 's',
      idempotencyKey: 'r:summarize',
      model: { provider: 'openai-compatible' as const, model: 'unpriced' },
      usage: { inputTokens: 5, outputTokens: 1 },
      memoised: false,
      estimatedCostUsd: null,
    };
    assert.equal(describeUsage([step]), '5/1 tok, n/a');
  });
});

describe('the result table counts what failed documents paid for', () => {
  it("adds the steps a failed document finished (its summary, say) to the row and to the run's total", () => {
    const published = publishedOutcome('ok', { usage: { inputTokens: 100, outputTokens: 10 } });
    const failed: DocumentOutcome = {
      ...publishedOutcome('broken', { usage: { inputTokens: 7, outputTokens: 3 } }),
      result: undefined,
      error: 'tag failed after 6 attempts',
    };
    const [summarize, tag, publish] = failed.report?.steps ?? [];
    assert.ok(summarize && tag && publish);
    Object.assign(summarize, {
      usage: { inputTokens: 40, outputTokens: 5 },
      rejectedUsage: { inputTokens: 2, outputTokens: 1 },
      estimatedCostUsd: 0.25,
    });
    Object.assign(tag, { status: 'failed', usage: undefined });
    Object.assign(publish, { status: 'not started' });
    const lines: string[] = [];
    printOutcomes([published, failed], (l) => lines.push(l), { columns: 200 });
    const row = lines.find((l) => l.startsWith('broken'));
    assert.match(row ?? '', /42\/6 tok, \$0\.250000/, lines.join('\n'));
    // 100/10 twice (the summary and tags of "ok") plus the failed one's summary and the answer it refused.
    assert.match(
      lines.join('\n'),
      /^Model usage: 242\/26 tok, .* in total, failed documents' paid steps included,/m,
    );
  });
});
