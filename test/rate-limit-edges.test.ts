/**
 * The edges of the pacing (issue 40, "limits exceeded or misread"), each through the real store classes on both
 * backends and the tests' provider stand-in (test/provider-limits.ts), which speaks the providers' documented
 * headers and 429 bodies over HTTP.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { sql } from 'kysely';
import { FailureType } from '../src/contract';
import { freshState } from '../src/model/rate-limit';
import { cleanupAfterAll } from './scratch';
import { answerBody, demoContent, startModelServer } from '../demo/model-server';
import { startLimitedProvider } from './provider-limits';
import { summarizeRequest } from './requests';
import { PACING_STORES, pacedCall, pacedModel } from './rate-limit-stores';
import { SqlRateLimits } from '../src/model/rate-limit-store';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import { freshSchema } from './postgres';

const defer = cleanupAfterAll();

/**
 * A chat completions server whose every answer carries the rate-limit headers of OpenAI's own documented example
 * (https://platform.openai.com/docs/guides/rate-limits, "Rate limits in headers"): 60 requests and 150,000 tokens a
 * minute, 59 and 149,984 left, back in 1s and 6m0s.
 */
async function documentedExampleServer() {
  const server = await startModelServer((request) => ({
    body: answerBody(request, demoContent(request) ?? '{}', { inputTokens: 100, outputTokens: 20 }),
    headers: {
      'x-ratelimit-limit-requests': '60',
      'x-ratelimit-limit-tokens': '150000',
      'x-ratelimit-remaining-requests': '59',
      'x-ratelimit-remaining-tokens': '149984',
      'x-ratelimit-reset-requests': '1s',
      'x-ratelimit-reset-tokens': '6m0s',
    },
  }));
  defer(() => server.close());
  return server;
}

/** Sends `n` small summarize calls at once through `model`; the ms each took to be answered. */
async function smallCalls(
  model: ReturnType<typeof pacedModel>,
  n: number,
  prefix: string,
): Promise<number[]> {
  const started = Date.now();
  return Promise.all(
    Array.from({ length: n }, async (_, i) => {
      await model.ask(summarizeRequest(1), words(400), pacedCall(`${prefix}-${i}`, 60_000));
      return Date.now() - started;
    }),
  );
}

const words = (chars: number): string =>
  'Rust has ownership and borrowing. '.repeat(Math.ceil(chars / 34)).slice(0, chars);

for (const store of PACING_STORES) {
  describe(`limits at their edges (${store.name})`, () => {
    it('a call larger than the whole tokens-a-minute limit fails at once, saying which limit and by how much', async () => {
      // 12,000 tokens a minute; the big document alone is some 15,000 prompt tokens.
      const provider = await startLimitedProvider({ limits: { rpm: 600, tpm: 12_000 } });
      defer(() => provider.close());
      const [limits] = await store.open(defer);
      const model = pacedModel(limits, provider.baseUrl);
      const started = Date.now();
      const small = [1, 2].map(async (i) => {
        await model.ask(summarizeRequest(1), words(400), pacedCall(`small-${i}`, 30_000));
        return Date.now() - started;
      });
      const big = model.ask(summarizeRequest(1), words(60_000), pacedCall('big', 30_000));
      await assert.rejects(big, (err: unknown) => {
        assert.ok(err instanceof ApplicationFailure, String(err));
        assert.equal(err.type, FailureType.ModelRejected);
        assert.equal(err.nonRetryable, true);
        assert.match(
          err.message,
          /tokens per min \(TPM\) limit: the call needs \d+, the limit is 12000 a minute, \d+ over/,
        );
        return true;
      });
      const failedAfter = Date.now() - started;
      const times = await Promise.all(small);
      const sent = provider.stats().calls.filter((c) => c.idempotencyKey === 'big');
      assert.equal(sent.length, 1, `the big call was sent ${sent.length} times`);
      assert.ok(failedAfter < 5_000, `the big call failed after ${failedAfter} ms`);
      // The calls beside it take their own turns only (some 350 tokens each at 200 a second).
      assert.ok(Math.max(...times) < 8_000, `the small calls took ${times.join(', ')} ms`);
    });

    it("reads a fixed window's reset (59 of 60 left, back in 59.4 s) as a window, not as a minute owed", async () => {
      const provider = await startLimitedProvider({ limits: { rpm: 60, tpm: 1_000_000 }, fixedWindow: true });
      defer(() => provider.close());
      const [limits] = await store.open(defer);
      const times = await smallCalls(pacedModel(limits, provider.baseUrl), 10, 'window');
      // 60 a minute, spread at one a second: the tenth goes some 9 s after the first.
      assert.ok(Math.max(...times) < 20_000, `10 calls answered after ${times.join(', ')} ms`);
      assert.equal(provider.stats().refused, 0);
    });

    it("reads OpenAI's documented example (149,984 of 150,000 tokens left, back in 6m0s) by what is left", async () => {
      const server = await documentedExampleServer();
      const [limits] = await store.open(defer);
      const times = await smallCalls(pacedModel(limits, server.baseUrl), 10, 'example');
      assert.ok(Math.max(...times) < 20_000, `10 calls answered after ${times.join(', ')} ms`);
      assert.equal(server.requests.length, 10);
    });
  });
}

for (const store of PACING_STORES) {
  describe(`the climb back after an overload (${store.name})`, () => {
    it('holds the fleet to the ramp for its 30 s, whatever turn a call queued again is given', async () => {
      const [limits] = await store.open(defer);
      const scope = `openai-compatible/gpt-4o-mini at http://127.0.0.1:1/${store.name}`;
      const settings = { tokensPerMinute: 60_000 };
      const hold = (key: string) => ({
        scope,
        holdKey: key,
        tokens: 100,
        usd: 0,
        workflowId: `wf-${key}`,
        leaseMs: 120_000,
      });
      const first = await limits.reserve(hold('first'), settings);
      assert.equal(first.kind, 'granted');
      if (first.kind !== 'granted') return;
      await limits.end(
        scope,
        { holdKey: 'first', nonce: first.nonce },
        { kind: 'refused', overloaded: true, retryAfterMs: 100, limits: {}, elapsedMs: 5 },
        settings,
      );
      const overloadedAt = Date.now();
      await new Promise((resolve) => setTimeout(resolve, 150));
      // 200 calls queue (one of them going again after the overload): at a quarter of 1,000 tokens a second,
      // climbing back over 30 s, the last turns fall past the ramp's end.
      const keys = Array.from({ length: 200 }, (_, i) => `call-${i}`);
      const turns = [];
      for (const key of keys) turns.push({ key, answer: await limits.reserve(hold(key), settings) });
      const last = turns.at(-1)?.answer;
      assert.ok(last?.kind === 'granted' && last.waitMs > 30_000, JSON.stringify(last));
      // Calls sent now, their turns come or not, fit the ramp's bucket: a quarter of one second's 1,000 tokens.
      let sent = 0;
      const admitting = Date.now();
      for (const { key, answer } of turns.slice(0, 20)) {
        if (answer.kind !== 'granted') continue;
        const admitted = await limits.admit(
          scope,
          { holdKey: key, nonce: answer.nonce },
          { tokens: 100 },
          settings,
        );
        if (admitted.kind === 'send') sent++;
      }
      // The ramp's bucket now (its factor climbs from a quarter to all of it over 30 s): 10 calls at the full rate,
      // and what it refilled while the admits went on (slow on a loaded machine: a tenth of a second each).
      const since = (Date.now() - overloadedAt) / 1000;
      const admitSeconds = (Date.now() - admitting) / 1000;
      const allowed = Math.ceil(10 * (0.25 + (0.75 * since) / 30) * (1 + admitSeconds)) + 1;
      assert.ok(since < 15, `the test took ${since} s to queue its calls`);
      assert.ok(
        sent <= allowed,
        `${sent} calls of 100 tokens went in ${admitSeconds} s, ${since} s after the overload (${allowed} allowed)`,
      );
    });
  });
}

for (const store of PACING_STORES) {
  describe(`a provider that announces no limits (${store.name})`, () => {
    it('one refusal of the first call is waited out, not taken for a limit of one call a minute', async () => {
      const provider = await startLimitedProvider({
        limits: { rpm: 600, tpm: 600_000 },
        limitHeaders: false,
      });
      defer(() => provider.close());
      const [limits] = await store.open(defer);
      // Someone else on the key sends a call that may answer with 50,000 tokens: it empties the tokens bucket (a
      // second's 10,000) for some 4 s, and the fleet's first call is refused.
      const other = await fetch(`${provider.baseUrl}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: 'Bearer test' },
        body: JSON.stringify({
          model: 'gpt-4o-mini',
          max_tokens: 50_000,
          messages: [{ role: 'user', content: 'Rust.' }],
        }),
      });
      assert.equal(other.status, 200);
      await other.arrayBuffer();
      const times = await smallCalls(pacedModel(limits, provider.baseUrl), 20, 'no-headers');
      const first = provider.stats().calls.find((c) => c.idempotencyKey !== undefined);
      assert.equal(first?.status, 429, "the fleet's first call was refused");
      assert.ok(Math.max(...times) < 30_000, `20 calls answered after ${times.join(', ')} ms`);
    });

    it('a rate of one call a minute that older code stored from a refusal no longer holds the fleet', async () => {
      const [limits, , db] = await store.open(defer);
      const scope = `openai-compatible/gpt-4o-mini at http://127.0.0.1:1/stored-${store.name}`;
      // The row as the code before kept it: the refusal's rate among the announced limits, for good.
      const stored = { ...freshState(0), headersSeen: false, learned: { requestsPerMinute: 1 }, refusals: 1 };
      delete (stored as { inferred?: unknown }).inferred;
      await db.run(
        sql`INSERT INTO model_limits (scope, state, updated_at) VALUES (${scope}, ${JSON.stringify(stored)},
          ${db.now()})`,
      );
      const waits: number[] = [];
      for (let i = 0; i < 10; i++) {
        const turn = await limits.reserve(
          {
            scope,
            holdKey: `stored-${i}`,
            tokens: 100,
            usd: 0,
            workflowId: `wf-stored-${i}`,
            leaseMs: 60_000,
          },
          {},
        );
        waits.push(turn.kind === 'granted' ? turn.waitMs : NaN);
      }
      assert.ok(
        waits.every((w) => w < 1_000),
        `the stored rate still paces: ${waits.join(', ')}`,
      );
    });

    it("a rate refusals showed climbs back when they stop, and the operator's MODEL_RPM replaces it", async () => {
      const [limits] = await store.open(defer);
      const scope = `openai-compatible/gpt-4o-mini at http://127.0.0.1:1/no-headers-${store.name}`;
      const hold = (key: string) => ({
        scope,
        holdKey: key,
        tokens: 100,
        usd: 0,
        workflowId: `wf-${key}`,
        leaseMs: 600_000,
      });
      // Ten calls answered without limit headers, then a refusal: the provider showed about 8 calls a minute.
      for (let i = 0; i < 11; i++) {
        const turn = await limits.reserve(hold(`seen-${i}`), {});
        assert.equal(turn.kind, 'granted', JSON.stringify(turn));
        if (turn.kind !== 'granted') return;
        await limits.end(
          scope,
          { holdKey: `seen-${i}`, nonce: turn.nonce },
          i < 10
            ? { kind: 'answered', reservedTokens: 100, usedTokens: 100, limits: {}, elapsedMs: 5 }
            : { kind: 'refused', overloaded: false, retryAfterMs: 100, limits: {}, elapsedMs: 5 },
          {},
        );
      }
      const waits = async (prefix: string, n: number, settings = {}) => {
        const out: number[] = [];
        for (let i = 0; i < n; i++) {
          const turn = await limits.reserve(hold(`${prefix}-${i}`), settings);
          out.push(turn.kind === 'granted' ? turn.waitMs : NaN);
        }
        return out;
      };
      const paced = await waits('paced', 30);
      // Paced at first (8 a minute: 7.5 s apart), then faster as no refusal comes: 30 calls in well under the
      // 225 s that 8 a minute would take.
      assert.ok(paced[2]! > 5_000, `the refusal's rate holds at first: ${paced.join(', ')}`);
      assert.ok(paced[29]! < 60_000, `and climbs back: ${paced.join(', ')}`);
      // MODEL_RPM=600 replaces what the refusal showed: 10 a second, from the end of the queue.
      const set = await waits('set', 10, { requestsPerMinute: 600 });
      assert.ok(set[9]! - set[0]! < 2_000, `MODEL_RPM=600 lifts the learned rate: ${set.join(', ')}`);
    });
  });
}

for (const store of PACING_STORES) {
  describe(`the cap on calls in flight (${store.name})`, () => {
    it('MODEL_MAX_CONCURRENT=2 with MODEL_RPM=60 holds two hosts to 2 calls in flight', async () => {
      const provider = await startLimitedProvider({
        limits: { rpm: 6_000, tpm: 10_000_000 },
        answerDelayMs: 2_500,
      });
      defer(() => provider.close());
      const [a, b] = await store.open(defer);
      const settings = { maxConcurrent: 2, requestsPerMinute: 60 };
      const hosts = [a, b].map((limits) => pacedModel(limits, provider.baseUrl, { settings }));
      await Promise.all(
        Array.from({ length: 6 }, (_, i) =>
          hosts[i % 2]!.ask(summarizeRequest(1), words(400), pacedCall(`cap-${i}`, 60_000)),
        ),
      );
      // The most calls the provider had open at once.
      const calls = provider.stats().calls;
      const edges = calls.flatMap((c) => [
        { at: c.receivedAt, d: 1 },
        { at: c.answeredAt ?? Infinity, d: -1 },
      ]);
      edges.sort((x, y) => x.at - y.at || x.d - y.d);
      let open = 0;
      let most = 0;
      for (const edge of edges) most = Math.max(most, (open += edge.d));
      assert.equal(calls.length, 6);
      assert.ok(most <= 2, `${most} calls were in flight at once`);
    });
  });
}

describe('a silent PostgreSQL session (PostgreSQL)', () => {
  it(
    "a worker frozen while it holds a provider's pacing row does not hold the fleet",
    { timeout: 90_000 },
    async () => {
      const url = await freshSchema(defer);
      const db = await openPostgres(url);
      defer(() => db.end());
      const limits = new SqlRateLimits(postgresSql(db));
      const scope = 'openai-compatible/gpt-4o-mini at http://127.0.0.1:1';
      const turn = (key: string) =>
        limits.reserve(
          { scope, holdKey: key, tokens: 100, usd: 0, workflowId: `wf-${key}`, leaseMs: 60_000 },
          { requestsPerMinute: 6_000 },
        );
      assert.equal((await turn('before')).kind, 'granted');
      const holder = spawn(
        process.execPath,
        ['--import', 'tsx', path.join(__dirname, 'pacing-lock-holder.ts'), url, scope],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      const exited = new Promise<void>((resolve) => holder.once('exit', () => resolve()));
      defer(async () => {
        holder.kill('SIGKILL');
        await exited;
      });
      let said = '';
      holder.stdout.on('data', (chunk: Buffer) => (said += chunk.toString('utf8')));
      holder.stderr.on('data', (chunk: Buffer) => (said += chunk.toString('utf8')));
      const deadline = Date.now() + 30_000;
      while (!said.includes('locked')) {
        assert.ok(
          Date.now() < deadline && holder.exitCode === null,
          `the holder did not lock the row: ${said}`,
        );
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      // The holder is stopped, its session idle in transaction with the row locked: the next turn waits for the
      // server to end that session, not for TCP keepalive.
      const started = Date.now();
      const answer = await turn('after');
      const waited = Date.now() - started;
      assert.equal(answer.kind, 'granted');
      assert.ok(waited < 15_000, `the fleet's next turn waited ${waited} ms for the frozen holder`);
    },
  );
});
