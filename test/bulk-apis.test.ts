/**
 * The providers' batch APIs as bulk mode speaks them (src/bulk/openai.ts, anthropic.ts), through
 * the official clients, against the local server that follows each API's documentation: an interrupted attempt's
 * batch found again (OpenAI by the claim in its metadata; Anthropic, which keeps no mark, by its time, size and
 * results), a create sent once (its answer lost, the SDK sends it no second time: the lookup finds the batch it
 * made), and refusals of the request that fail at once saying what to fix.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { ApplicationFailure } from '@temporalio/common';
import { summarizeRequest } from './requests';
import { tagRequest } from './requests';
import { AnthropicBulkApi } from '../src/bulk/anthropic';
import { OpenAiBulkApi } from '../src/bulk/openai';
import type { BulkApi, BulkLine } from '../src/bulk/types';
import { LOCAL_BATCH_KEY, startBatchServer } from '../demo/batch-server';
import type { BatchServer } from '../demo/batch-server';
import { remoteModel } from '../src/model/choose';
import { findProvider } from '../src/model/providers';
import { SAMPLE_TEXT } from './helpers';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();
let server: BatchServer;
let release = false;

before(async () => {
  server = await startBatchServer({ completeWhen: () => release });
  defer(() => server.close());
});

function api(provider: 'openai' | 'anthropic', apiKey = LOCAL_BATCH_KEY): BulkApi {
  const settings = remoteModel(findProvider(provider)!, {
    model: provider === 'openai' ? 'gpt-4o-mini' : 'claude-haiku-4-5',
    baseUrl: server.baseUrl,
    apiKey,
  });
  return provider === 'openai' ? new OpenAiBulkApi(settings) : new AnthropicBulkApi(settings);
}

function lines(prefix: string, n: number): BulkLine[] {
  return Array.from({ length: n }, (_, i) => ({
    record: {
      customId: `${prefix}-${i}`,
      memoKey: `m-${prefix}-${i}`,
      workflowId: 'w',
      step: i % 2 === 0 ? 'summarize' : 'tag',
      requestHash: 'h',
      textRef: 't',
      input: {},
    },
    request: i % 2 === 0 ? summarizeRequest(2) : tagRequest(3),
    text: SAMPLE_TEXT,
  }));
}

const ids = (ls: BulkLine[]): Set<string> => new Set(ls.map((l) => l.record.customId));
const signal = new AbortController().signal;

describe("the providers' batch APIs", () => {
  it('finds the OpenAI batch an interrupted attempt created by the claim in its metadata, and no other', async () => {
    release = false;
    const openai = api('openai');
    const claimedAt = new Date();
    const a = await openai.create('claim-a', lines('a', 4), signal);
    const b = await openai.create('claim-b', lines('b', 4), signal);
    const none = new Set<string>();
    assert.equal(
      (await openai.find('claim-a', { claimedAt, customIds: ids(lines('a', 4)), taken: none }, signal))?.id,
      a.id,
    );
    assert.equal(
      (await openai.find('claim-b', { claimedAt, customIds: ids(lines('b', 4)), taken: none }, signal))?.id,
      b.id,
    );
    assert.equal(
      await openai.find('claim-c', { claimedAt, customIds: ids(lines('c', 4)), taken: none }, signal),
      undefined,
    );
    // A batch made long before the claim is not looked at (the listing stops there).
    const later = new Date(Date.now() + 3_600_000);
    assert.equal(
      await openai.find('claim-a', { claimedAt: later, customIds: ids(lines('a', 4)), taken: none }, signal),
      undefined,
    );
  });

  it('finds the Anthropic batch of a claim by its time and size, and where several fit, by the custom_ids of their results', async () => {
    release = false;
    const anthropic = api('anthropic');
    const claimedAt = new Date();
    const none = new Set<string>();
    const x = await anthropic.create('claim-x', lines('x', 6), signal);
    // One fits: it is adopted.
    assert.equal(
      (await anthropic.find('claim-x', { claimedAt, customIds: ids(lines('x', 6)), taken: none }, signal))
        ?.id,
      x.id,
    );
    // Another of the same size: two fit, neither has ended, so which is whose is not known yet: try again later.
    const y = await anthropic.create('claim-y', lines('y', 6), signal);
    await assert.rejects(
      anthropic.find('claim-y', { claimedAt, customIds: ids(lines('y', 6)), taken: none }, signal),
      (err) =>
        err instanceof ApplicationFailure && !err.nonRetryable && /looking again later/.test(err.message),
    );
    // Owned by another claim, a batch is not a candidate.
    assert.equal(
      (
        await anthropic.find(
          'claim-y',
          { claimedAt, customIds: ids(lines('y', 6)), taken: new Set([x.id]) },
          signal,
        )
      )?.id,
      y.id,
    );
    // Once they have ended, the results tell.
    release = true;
    await anthropic.retrieve(x.id, signal);
    await anthropic.retrieve(y.id, signal);
    assert.equal(
      (await anthropic.find('claim-y', { claimedAt, customIds: ids(lines('y', 6)), taken: none }, signal))
        ?.id,
      y.id,
    );
    assert.equal(
      (await anthropic.find('claim-x', { claimedAt, customIds: ids(lines('x', 6)), taken: none }, signal))
        ?.id,
      x.id,
    );
    assert.equal(
      await anthropic.find('claim-z', { claimedAt, customIds: ids(lines('z', 6)), taken: none }, signal),
      undefined,
    );
  });

  for (const provider of ['openai', 'anthropic'] as const) {
    it(`fails at once, naming the key to check, when ${provider} refuses the key`, async () => {
      await assert.rejects(
        api(provider, 'wrong-key').create('claim-k', lines('k', 2), signal),
        (err) =>
          err instanceof ApplicationFailure &&
          err.nonRetryable &&
          err.message.includes(provider === 'openai' ? 'OPENAI_API_KEY' : 'ANTHROPIC_API_KEY'),
      );
    });
  }

  for (const provider of ['openai', 'anthropic'] as const)
    for (const lost of ['reset', 'gateway'] as const) {
      it(`sends ${provider}'s create once: its answer lost (${lost}), the create fails, and the one batch it made is found`, async () => {
        const losing = await startBatchServer({
          loseAnswer: ({ action, n }) => (action === 'create' && n === 1 ? lost : undefined),
        });
        defer(() => losing.close());
        const settings = remoteModel(findProvider(provider)!, {
          model: provider === 'openai' ? 'gpt-4o-mini' : 'claude-haiku-4-5',
          baseUrl: losing.baseUrl,
          apiKey: LOCAL_BATCH_KEY,
        });
        const bulkApi = provider === 'openai' ? new OpenAiBulkApi(settings) : new AnthropicBulkApi(settings);
        const claimedAt = new Date();
        const sent = lines(`lost-${provider}-${lost}`, 4);
        // Retryable: it says nothing of whether the batch was made.
        await assert.rejects(
          bulkApi.create('claim-lost', sent, signal),
          (err) => !(err instanceof ApplicationFailure && err.nonRetryable),
        );
        assert.equal(losing.batches.length, 1, 'the create was sent again');
        const found = await bulkApi.find(
          'claim-lost',
          { claimedAt, customIds: ids(sent), taken: new Set() },
          signal,
        );
        assert.equal(found?.id, losing.batches[0]?.id);
      });
    }

  it("reads answers, refusals and errors of an ended batch in the step's shape", async () => {
    const faulty = await startBatchServer({
      fault: ({ index }) => (index === 1 ? 'refuse' : index === 2 ? 'error' : undefined),
    });
    defer(() => faulty.close());
    for (const provider of ['openai', 'anthropic'] as const) {
      const settings = remoteModel(findProvider(provider)!, {
        model: 'm',
        baseUrl: faulty.baseUrl,
        apiKey: LOCAL_BATCH_KEY,
      });
      const bulkApi = provider === 'openai' ? new OpenAiBulkApi(settings) : new AnthropicBulkApi(settings);
      const sent = lines(provider, 4);
      const made = await bulkApi.create(`claim-${provider}`, sent, signal);
      assert.equal((await bulkApi.retrieve(made.id, signal)).ended, true);
      const outcomes = [];
      for await (const o of bulkApi.results(
        made.id,
        new Map(sent.map((l) => [l.record.customId, l.request])),
        signal,
      ))
        outcomes.push(o);
      const byId = new Map(outcomes.map((o) => [o.customId, o]));
      // What a line was billed for its prompt is within the worst case a budget's cut counts for it.
      for (const line of sent) {
        const billed = byId.get(line.record.customId);
        if (billed?.kind === 'answered' || billed?.kind === 'refused')
          assert.ok(billed.usage.inputTokens <= bulkApi.worstInputTokens(line), provider);
      }
      assert.equal(byId.get(`${provider}-0`)?.kind, 'answered');
      assert.deepEqual(Object.keys((byId.get(`${provider}-0`) as { value: object }).value), ['summary']);
      assert.equal(byId.get(`${provider}-1`)?.kind, 'refused');
      assert.equal(byId.get(`${provider}-2`)?.kind, 'errored');
      assert.ok(Array.isArray((byId.get(`${provider}-3`) as { value: { tags?: unknown } }).value.tags));
    }
  });
});
