/** Cost accounting: tokens from the provider's usage fields, priced from the table, counted once per step. */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describe, it } from 'node:test';
import { MockActivityEnvironment } from '@temporalio/testing';
import { createActivities } from '../activities';
import { describeUsage, printOutcomes } from '../src/runs/result-table';
import type { DocumentOutcome } from '../src/runs/result-table';
import { publishedOutcome } from './outcomes';
import { loadConfig } from '../src/config';
import { DEFAULT_PRICES, estimateCost, formatCost } from '../src/model/pricing';
import type { SummarizeResult, TagResult } from '../src/contract';
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

  it('takes extra and overriding prices from MODEL_PRICES', () => {
    const config = loadConfig({
      MODEL_PRICES:
        '{"my-local-llm": {"inputPerMillion": 0, "outputPerMillion": 0}, "gpt-4o-mini": {"inputPerMillion": 1, "outputPerMillion": 1}}',
    });
    assert.deepEqual(config.prices['my-local-llm'], { inputPerMillion: 0, outputPerMillion: 0 });
    assert.deepEqual(config.prices['gpt-4o-mini'], { inputPerMillion: 1, outputPerMillion: 1 });
    assert.ok(config.prices['gpt-4o'], 'the defaults stay for models MODEL_PRICES does not name');
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
    const activities = createActivities(parts.deps);
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
