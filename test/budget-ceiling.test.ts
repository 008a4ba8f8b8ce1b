/**
 * A budget is a ceiling on what the provider bills, not on estimates: on both store backends, through the
 * project's own client, pacing and store classes, against a provider stand-in that bills like the provider and
 * logs what it billed (test/billing-provider.ts). Documents in a script that tokenizes densely (Chinese), prompt
 * cache writes billed at 1.25x, a worker SIGKILLed after its request went out, and calls that time out on our
 * side while the provider answers and bills: the provider's bill never passes the budget, and the budget's spent
 * is never below the bill.
 */
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { ApplicationFailure } from '@temporalio/common';
import { FailureType } from '../src/contract';
import { documentBlock, SYSTEM, taskOf } from '../src/model/prompt-frame';
import { Pacer } from '../src/model/pacer';
import { SqlRateLimits } from '../src/model/rate-limit-store';
import type { BudgetRef } from '../src/model/rate-limit-store';
import { utf8Bytes, worstCaseTokens } from '../src/model/worst-case';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import { openSqlite } from '../src/store/sql-sqlite';
import { startBillingProvider } from './billing-provider';
import type { BillingProvider } from './billing-provider';
import {
  ask,
  budgetedModel,
  chineseAnswer,
  chineseText,
  MAX_OUTPUT_TOKENS,
  summaryRequest,
  tagsRequest,
} from './budget-calls';
import { silentLogger } from './helpers';
import { freshSchema } from './postgres';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();

interface Store {
  name: string;
  /** A fresh store: its location (for a worker process), a handle on it, and the environment of a CLI on it. */
  open(): Promise<{ location: string; limits: SqlRateLimits; env: NodeJS.ProcessEnv }>;
}

const STORES: Store[] = [
  {
    name: 'SQLite',
    open() {
      const file = path.join(scratchDir(defer, 'budget-ceiling-'), 'memo.db');
      const db = openSqlite(file, 'memo');
      defer(() => db.close());
      return Promise.resolve({
        location: file,
        limits: new SqlRateLimits(db),
        env: { DATA_DIR: path.dirname(file) },
      });
    },
  },
  {
    name: 'PostgreSQL',
    async open() {
      const url = await freshSchema(defer);
      const pool = await openPostgres(url);
      defer(() => pool.end());
      return { location: url, limits: new SqlRateLimits(postgresSql(pool)), env: { DATABASE_URL: url } };
    },
  },
];

async function provider(delayMs?: Parameters<typeof startBillingProvider>[1]): Promise<BillingProvider> {
  const started = await startBillingProvider(chineseAnswer, delayMs);
  defer(() => started.close());
  return started;
}

/** Runs `call`, returning 'budget' when it failed for its budget (the run would wait), rethrowing anything else. */
async function unlessBudget<T>(call: () => Promise<T>): Promise<T | 'budget'> {
  try {
    return await call();
  } catch (err) {
    if (err instanceof ApplicationFailure && err.type === FailureType.BudgetExhausted) return 'budget';
    throw err;
  }
}

/** The most the summary request on `text` may be billed: what the budget holds for it. */
function worstCaseOfSummary(text: string): number {
  return worstCaseTokens(
    utf8Bytes(SYSTEM, documentBlock(text), taskOf(summaryRequest.instructions, MAX_OUTPUT_TOKENS)),
    MAX_OUTPUT_TOKENS,
  );
}

/** The provider's bill against the budget's own record: never past the limit, never more than the record says. */
async function assertWithin(
  limits: SqlRateLimits,
  budget: BudgetRef,
  billed: BillingProvider,
  t: { diagnostic(message: string): void },
): Promise<void> {
  const status = await limits.budget(budget.id);
  assert.ok(status !== undefined);
  const tokens = billed.billedTokens();
  const usd = billed.billedUsd();
  t.diagnostic(
    `billed ${tokens} tokens, $${usd.toFixed(6)} in ${billed.bills.length} request(s); the budget says spent ` +
      `${status.spentTokens} tokens, $${status.spentUsd.toFixed(6)}, limit ${budget.tokens ?? '-'} tokens, ` +
      `$${budget.usd ?? '-'}`,
  );
  if (budget.tokens !== undefined)
    assert.ok(tokens <= budget.tokens, `billed ${tokens} tokens on a budget of ${budget.tokens}`);
  if (budget.usd !== undefined)
    assert.ok(usd <= budget.usd + 1e-12, `billed $${usd.toFixed(6)} on a budget of $${budget.usd}`);
  assert.ok(status.spentTokens >= tokens, `the budget shows ${status.spentTokens} spent, ${tokens} billed`);
  assert.ok(status.spentUsd >= usd - 1e-12, `the budget shows $${status.spentUsd} spent, $${usd} billed`);
}

/**
 * Starts a worker process making one budgeted call (test/fixtures/budget-call.ts, `args`), and SIGKILLs it as soon
 * as the provider got its request.
 */
async function killAfterSend(billed: BillingProvider, args: string[]): Promise<'killed' | 'budget'> {
  const sent = billed.bills.length;
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', path.join('test', 'fixtures', 'budget-call.ts'), ...args],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise((resolve) => child.on('exit', resolve));
  defer(() => void child.kill('SIGKILL'));
  const deadline = Date.now() + 60_000;
  while (billed.bills.length === sent) {
    if (child.exitCode !== null) {
      // Refused by its budget before it sent anything: the run would wait.
      if (stderr.includes("type: 'BudgetExhausted'")) return 'budget';
      throw new Error(`the worker ended before its request: ${stderr}`);
    }
    if (Date.now() > deadline) throw new Error(`the worker sent nothing in 60 s: ${stderr}`);
    await sleep(20);
  }
  child.kill('SIGKILL');
  await exited;
  return 'killed';
}

/** `npm run budget -- <args>` on the store `env` names: its exit code and what it printed. */
function budgetCli(env: NodeJS.ProcessEnv, args: string[]): Promise<{ code: number; output: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', path.join('src', 'cli', 'budget.ts'), ...args],
      // No Temporal server: nothing to wake is told so.
      { env: { ...process.env, ...env, TEMPORAL_ADDRESS: '127.0.0.1:1' }, timeout: 60_000 },
      (err, stdout, stderr) =>
        resolve({
          code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1,
          output: `${stdout}${stderr}`,
        }),
    );
  });
}

const SCOPE = 'test/budget-ceiling@http://127.0.0.1:1';
const KNOWN = { requestsPerMinute: 60_000 };

/** A call's hold under `budget`, as the pacing asks for one. */
function holdFor(holdKey: string, budget: BudgetRef, tokens: number) {
  return {
    scope: SCOPE,
    holdKey,
    tokens: 100,
    budgetTokens: tokens,
    usd: 0,
    budget,
    workflowId: `wf-${holdKey}`,
    leaseMs: 60_000,
  };
}

for (const store of STORES) {
  describe(`budgets hold what the provider bills (${store.name})`, () => {
    it('a token budget on documents in Chinese: the bill stays within it', async (t) => {
      const { limits } = await store.open();
      const billed = await provider();
      const model = budgetedModel(limits, { api: 'openai-compatible', baseUrl: billed.baseUrl });
      const budget = { id: `budget-${randomUUID()}`, tokens: 12_000 };
      const outcomes: unknown[] = [];
      // Ten documents, three at a time, each asked for its summary and its tags.
      for (let first = 0; first < 10; first += 3) {
        const docs = [first, first + 1, first + 2].filter((i) => i < 10);
        outcomes.push(
          ...(await Promise.all(
            docs.flatMap((i) => {
              const text = chineseText(1_500, i);
              return [
                unlessBudget(() =>
                  ask(model, summaryRequest, text, { holdKey: `zh-${i}:summarize`, budget }),
                ),
                unlessBudget(() => ask(model, tagsRequest, text, { holdKey: `zh-${i}:tag`, budget })),
              ];
            }),
          )),
        );
      }
      assert.ok(billed.bills.length > 0, 'some calls fit the budget');
      assert.ok(outcomes.includes('budget'), 'the budget ran out');
      await assertWithin(limits, budget, billed, t);
    });

    it('a dollar budget on Anthropic, each document written to the prompt cache: the bill stays within it', async (t) => {
      const { limits } = await store.open();
      // Several budgets, so that the last call admitted under one leaves whatever room it leaves. English: a count
      // of 4 characters a token is right for it, and only the cache write's surcharge is left to miss. Ideographs
      // of CJK Extension B: billed a token a byte, so no margin of the bytes' bound hides the surcharge either.
      const english = (key: string): string =>
        `Document ${key}. ${'Durable workflows resume from their last finished step after a crash. '.repeat(560)}`;
      const extensionB = (key: string): string =>
        `${key} ${Array.from({ length: 10_000 }, (_, i) => String.fromCodePoint(0x20000 + ((i * 7919) % 40_000))).join('')}`;
      for (const [kind, usd] of [
        [english, 0.06],
        [english, 0.08],
        [english, 0.1],
        [english, 0.12],
        [extensionB, 0.06],
        [extensionB, 0.095],
        [extensionB, 0.145],
      ] as const) {
        const billed = await provider();
        const model = budgetedModel(limits, { api: 'anthropic', baseUrl: billed.baseUrl });
        const budget = { id: `budget-${randomUUID()}`, usd };
        for (let i = 0; i < 12; i++) {
          const key = `${kind.name}-${usd}-${i}`;
          const summary = await unlessBudget(() =>
            ask(model, summaryRequest, kind(key), { holdKey: `cache-${key}:summarize`, budget }),
          );
          if (summary === 'budget') break;
        }
        assert.ok(billed.bills.length > 0);
        assert.ok(
          billed.bills.every((b) => b.cacheWriteTokens > 0),
          'every document was billed a cache write',
        );
        await assertWithin(limits, budget, billed, t);
      }
    });

    it('a worker SIGKILLed after its request went out: the killed call is charged, the bill stays within', async (t) => {
      const { location, limits } = await store.open();
      // The first and third requests are served slowly (their workers are killed meanwhile); billed all the same.
      const billed = await provider((n) => (n === 1 || n === 3 ? 60_000 : 0));
      const text = chineseText(600, 7);
      const file = path.join(scratchDir(defer, 'budget-kill-'), 'document.txt');
      writeFileSync(file, text);
      // Room for three calls at their worst, not four.
      const budget = { id: `budget-${randomUUID()}`, tokens: Math.floor(3.2 * worstCaseOfSummary(text)) };
      const leaseMs = 3_000;
      const killedAfterSend = (holdKey: string): Promise<'killed' | 'budget'> =>
        killAfterSend(billed, [
          location,
          'openai-compatible',
          billed.baseUrl,
          holdKey,
          budget.id,
          String(budget.tokens),
          String(leaseMs),
          file,
        ]);
      const model = budgetedModel(limits, { api: 'openai-compatible', baseUrl: billed.baseUrl, leaseMs });
      // Killed after sending; its next attempt (the same key, as Temporal's retry) comes at once, within the
      // killed one's lease, finds it sent, and charges it.
      const first = `killed-${randomUUID()}:summarize`;
      assert.equal(await killedAfterSend(first), 'killed');
      assert.ok((await ask(model, summaryRequest, text, { holdKey: first, budget })).value.length > 0);
      const retried = await limits.budget(budget.id);
      assert.ok(
        (retried?.spentTokens ?? 0) >= billed.billedTokens(),
        `two calls billed ${billed.billedTokens()} tokens; the budget shows ${retried?.spentTokens} spent`,
      );
      // Killed after sending, and nobody comes back for it: once its lease lapses the budget charges it by itself.
      assert.equal(await killedAfterSend(`killed-${randomUUID()}:summarize`), 'killed');
      await sleep(leaseMs + 500);
      const lapsed = await limits.budget(budget.id);
      assert.ok(
        (lapsed?.spentTokens ?? 0) >= billed.billedTokens(),
        `three calls billed ${billed.billedTokens()} tokens; the budget shows ${lapsed?.spentTokens} spent`,
      );
      assert.equal(billed.bills.length, 3);
      await assertWithin(limits, budget, billed, t);
      // A fourth call at its worst no longer fits: the run would wait for the budget to be raised.
      const fourth = await unlessBudget(() =>
        ask(model, summaryRequest, text, { holdKey: `another-${randomUUID()}:summarize`, budget }),
      );
      assert.equal(fourth, 'budget');
      assert.equal(billed.bills.length, 3);
    });

    it('calls that time out on our side while the provider answers and bills: charged, the bill stays within', async (t) => {
      const { limits } = await store.open();
      // Every answer takes 1.5 s; the client waits 500 ms.
      const billed = await provider(() => 1_500);
      const model = budgetedModel(limits, {
        api: 'openai-compatible',
        baseUrl: billed.baseUrl,
        requestTimeoutMs: 500,
      });
      const text = chineseText(600, 3);
      const budget = { id: `budget-${randomUUID()}`, tokens: Math.floor(2.5 * worstCaseOfSummary(text)) };
      const holdKey = `timeouts-${randomUUID()}:summarize`;
      // Temporal's attempts, one after the other under the same key, until the budget stops them.
      let last: unknown;
      for (let attempt = 1; attempt <= 6; attempt++) {
        last = await unlessBudget(() => ask(model, summaryRequest, text, { holdKey, budget })).catch(
          (err: unknown) => err,
        );
        if (last === 'budget') break;
        assert.ok(
          last instanceof ApplicationFailure && last.type === FailureType.TransientModelError,
          String(last),
        );
      }
      assert.equal(last, 'budget', 'the budget stopped the attempts');
      assert.equal(billed.bills.length, 2, 'two attempts fit the budget at their worst');
      await assertWithin(limits, budget, billed, t);
    });

    it('npm run budget: raise refuses a total below spent plus promised, waiters are listed while they wait, and the command names the limit that binds', async () => {
      const { limits, env } = await store.open();
      const budget = { id: `budget-${randomUUID()}`, tokens: 10_000 };
      const one = await limits.reserve(holdFor('one', budget, 4_000), KNOWN);
      assert.equal(one.kind, 'granted');
      if (one.kind !== 'granted') return;
      await limits.end(SCOPE, { holdKey: 'one', nonce: one.nonce }, { kind: 'unanswered' }, KNOWN, {
        tokens: 3_000,
        usd: 0,
      });
      const two = await limits.reserve(holdFor('two', budget, 4_000), KNOWN);
      assert.equal(two.kind, 'granted');
      if (two.kind !== 'granted') return;
      // 3,000 spent and 4,000 promised: a total of 6,000 would be passed as the call under way ends.
      const low = await budgetCli(env, ['raise', budget.id, '--tokens', '6000']);
      assert.equal(low.code, 1, low.output);
      assert.match(low.output, /promised to calls under way \(4000\): give at least 7000/);
      // A call that fits what is left once the promise ends waits for it, unlisted.
      const waits = await limits.reserve(holdFor('waits', budget, 4_000), KNOWN);
      assert.equal(waits.kind, 'promised');
      // One that does not fit what is left at all pauses its run, listed, told to raise the tokens.
      const big = await limits.reserve(holdFor('big', budget, 8_000), KNOWN);
      assert.equal(big.kind, 'budget');
      const listed = await budgetCli(env, []);
      assert.equal(listed.code, 0, listed.output);
      assert.match(listed.output, /1 run\(s\) waiting: wf-big\n/);
      assert.match(
        listed.output,
        new RegExp(`raise it: npm run budget -- raise ${budget.id} --tokens <new total>\n`),
      );
      assert.doesNotMatch(listed.output, /--usd/);
      // The promise ends below what it promised: the waiting call goes on.
      await limits.end(SCOPE, { holdKey: 'two', nonce: two.nonce }, { kind: 'unanswered' }, KNOWN, {
        tokens: 1_000,
        usd: 0,
      });
      assert.equal((await limits.reserve(holdFor('waits', budget, 4_000), KNOWN)).kind, 'granted');
      // The big one, retried by its run's timer after a raise by hand elsewhere, goes on too: no longer listed.
      await limits.setBudget(budget.id, { tokens: 20_000 });
      await limits.reserve(holdFor('big', budget, 8_000), KNOWN);
      const after = await budgetCli(env, []);
      assert.match(after.output, /No run waits for a budget/);
      const enough = await budgetCli(env, ['raise', budget.id, '--tokens', '30000']);
      assert.equal(enough.code, 0, enough.output);
    });

    it("a run refused for promises only goes on when they end, unlisted; a token budget's refusal says raise --tokens", async () => {
      const { limits } = await store.open();
      const billed = await provider();
      const model = budgetedModel(limits, { api: 'openai-compatible', baseUrl: billed.baseUrl });
      const text = chineseText(600, 5);
      const worst = worstCaseOfSummary(text);
      // Room for one call at its worst, and another once the first has spent what it used.
      const budget = { id: `budget-${randomUUID()}`, tokens: Math.floor(1.8 * worst) };
      const both = await Promise.all(
        ['a', 'b'].map((k) =>
          ask(model, summaryRequest, text, { holdKey: `promised-${k}:summarize`, budget }),
        ),
      );
      assert.equal(both.length, 2);
      assert.equal(billed.bills.length, 2);
      assert.deepEqual(await limits.waitingBudgets(), []);
      const refused = await ask(model, summaryRequest, text, {
        holdKey: 'promised-c:summarize',
        budget,
      }).catch((err: unknown) => err);
      assert.ok(refused instanceof ApplicationFailure && refused.type === FailureType.BudgetExhausted);
      assert.match(refused.message, new RegExp(`npm run budget -- raise ${budget.id} --tokens <new total>`));
      assert.doesNotMatch(refused.message, /--usd/);
    });

    it('a step that fails past its step budget while waiting its turn gives the turn up', async () => {
      const { limits } = await store.open();
      const scope = `${SCOPE}/${randomUUID()}`;
      const pacer = new Pacer(
        limits,
        scope,
        { provider: 'test', model: 'slow' },
        {
          leaseMs: 60_000,
          settings: { requestsPerMinute: 1 },
          log: silentLogger,
        },
      );
      const call = (key: string) =>
        pacer.run(
          {
            holdKey: key,
            workflowId: `wf-${key}`,
            step: 'summarize',
            attemptEndsAt: Infinity,
            stepEndsAt: Date.now() + 5_000,
            signal: new AbortController().signal,
          },
          {
            promptChars: 100,
            maxOutputTokens: 10,
            send: () =>
              Promise.resolve({ value: key, usage: { inputTokens: 25, outputTokens: 10 }, limits: {} }),
          },
        );
      await call('first');
      // One call a minute: the second's turn is a minute off, past its step's budget of 5 s.
      await assert.rejects(call('second'), /past the step's budget/);
      const status = await limits.status(scope);
      assert.equal(status?.waiting, 0, 'no call is shown waiting its turn');
    });

    it('one budget through all of it: Chinese documents, cache writes, killed workers and timeouts; the bill stays within', async (t) => {
      const { location, limits } = await store.open();
      // Requests of the keys marked slow are answered after 60 s (their workers are killed, or time out, first).
      const billed = await provider((_n, request) =>
        request.idempotencyKey?.startsWith('slow-') === true ? 60_000 : 0,
      );
      const budget = { id: `budget-${randomUUID()}`, tokens: 120_000, usd: 0.1 };
      const dir = scratchDir(defer, 'budget-all-');
      const documents = Array.from({ length: 12 }, (_, i) => chineseText(3_000, 20 + i));
      const fast = budgetedModel(limits, { api: 'anthropic', baseUrl: billed.baseUrl, leaseMs: 3_000 });
      const impatient = budgetedModel(limits, {
        api: 'anthropic',
        baseUrl: billed.baseUrl,
        requestTimeoutMs: 500,
      });
      let refusals = 0;
      for (const [i, text] of documents.entries()) {
        const key = `doc-${i}`;
        if (i % 4 === 1) {
          // A worker killed after its request went out; the attempt after it goes on as usual.
          const file = path.join(dir, `${key}.txt`);
          writeFileSync(file, text);
          const killed = await killAfterSend(billed, [
            location,
            'anthropic',
            billed.baseUrl,
            `slow-${key}:summarize`,
            budget.id,
            JSON.stringify({ tokens: budget.tokens, usd: budget.usd }),
            '3000',
            file,
          ]);
          if (killed === 'budget') refusals++;
        }
        if (i % 4 === 2) {
          // An attempt that times out on our side while the provider bills it.
          const timedOut = await unlessBudget(() =>
            ask(impatient, summaryRequest, text, { holdKey: `slow-${key}:summarize`, budget }),
          ).catch((err: unknown) => err);
          if (timedOut === 'budget') refusals++;
        }
        const summary = await unlessBudget(() =>
          ask(fast, summaryRequest, text, { holdKey: `${key}:summarize`, budget }),
        );
        const tags = await unlessBudget(() =>
          ask(fast, tagsRequest, text, { holdKey: `${key}:tag`, budget }),
        );
        refusals += [summary, tags].filter((answer) => answer === 'budget').length;
      }
      assert.ok(refusals > 0, 'the budget ran out');
      assert.ok(
        billed.bills.some((b) => b.cacheWriteTokens > 0) && billed.bills.some((b) => b.cacheReadTokens > 0),
      );
      assert.ok(
        billed.bills.some((b) => b.request.cutOff),
        'some requests were cut off after they were billed',
      );
      // The killed workers' holds lapse (3 s) and are charged by themselves.
      await sleep(3_500);
      await assertWithin(limits, budget, billed, t);
    });
  });
}
