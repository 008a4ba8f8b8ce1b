/**
 * The pacing of provider calls: its arithmetic (src/model/rate-limit.ts) on its own, then the shared store
 * (src/model/rate-limit-store.ts) on both backends, with two handles on one store standing for two worker hosts.
 * The whole pipeline at a real limit is test/provider-limits-run.test.ts.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  admit,
  calibrate,
  freshState,
  limitsFromHeaders,
  PROBE_LEASE_MS,
  RAMP_MS,
  reserve,
  settle,
} from '../src/model/rate-limit';
import type { LimitState, Reservation } from '../src/model/rate-limit';
import { SqlRateLimits } from '../src/model/rate-limit-store';
import { Pacer } from '../src/model/pacer';
import { openSqlite } from '../src/store/sql-sqlite';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import { freshSchema } from './postgres';
import { cleanupAfterAll, scratchDir } from './scratch';
import { silentLogger } from './helpers';

const defer = cleanupAfterAll();

function granted(r: Reservation): Extract<Reservation, { kind: 'granted' }> {
  assert.equal(r.kind, 'granted', `expected a turn, got ${JSON.stringify(r)}`);
  return r as Extract<Reservation, { kind: 'granted' }>;
}

/** Reserves `n` calls of `tokens` each at `now`, one after the other; returns their start times and the state. */
function queue(state: LimitState, now: number, n: number, tokens: number, settings = {}) {
  const starts: number[] = [];
  let s = state;
  for (let i = 0; i < n; i++) {
    const r = granted(reserve(s, now, { tokens }, settings, 0));
    starts.push(r.startAt);
    s = r.state;
  }
  return { starts, state: s };
}

describe('pacing arithmetic', () => {
  it('spreads calls evenly at the requests-a-minute limit, from the first call on', () => {
    const { starts } = queue(freshState(0), 0, 10, 10, { requestsPerMinute: 120 });
    // 120 a minute: one every 500 ms; half a second's worth of the limit (one call) may go at once, the other
    // half of the second's worth the provider's bucket holds is slack.
    assert.deepEqual(starts, [0, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500]);
  });

  it('spaces calls by their tokens at the tokens-a-minute limit', () => {
    // 60,000 tokens a minute: 1,000 a second; calls of 2,000 tokens go every 2 s.
    const { starts } = queue(freshState(0), 0, 4, 2_000, { tokensPerMinute: 60_000 });
    assert.deepEqual(starts, [0, 2000, 4000, 6000]);
  });

  it('with no limit known, lets one call go first and holds the others until its answer says the limits', () => {
    const first = granted(reserve(freshState(0), 0, { tokens: 100 }, {}, 0));
    assert.equal(first.probe, true);
    const second = reserve(first.state, 10, { tokens: 100 }, {}, 1);
    assert.deepEqual(second, { kind: 'busy', retryInMs: 500, why: 'probe' });
    // The probe's answer announces 60 a minute, with 59 left.
    const { state: learned } = settle(
      first.state,
      300,
      {
        kind: 'answered',
        reservedTokens: 100,
        usedTokens: 80,
        limits: limitsFromHeaders(
          new Headers({ 'x-ratelimit-limit-requests': '60', 'x-ratelimit-remaining-requests': '59' }),
        ),
        elapsedMs: 300,
      },
      {},
    );
    // The provider's count says the probe's request is still being refilled: the next goes a second after it.
    const { starts } = queue(learned, 300, 3, 100);
    assert.deepEqual(
      starts.map((t) => Math.round(t)),
      [1000, 2000, 3000],
    );
    // A probe whose worker died holds the others back no longer than its lease.
    assert.equal(granted(reserve(first.state, PROBE_LEASE_MS + 1, { tokens: 1 }, {}, 0)).probe, true);
  });

  it('a refusal holds every caller back for its Retry-After; an overload also climbs back to the rate', () => {
    const settings = { requestsPerMinute: 600 };
    const { state: refused } = settle(
      freshState(0),
      1_000,
      { kind: 'refused', overloaded: false, retryAfterMs: 1_500, limits: {}, elapsedMs: 20 },
      settings,
    );
    assert.equal(refused.refusals, 1);
    assert.equal(granted(reserve(refused, 1_000, { tokens: 1 }, settings, 0)).startAt, 2_500);
    const { state: overloaded } = settle(
      freshState(0),
      1_000,
      { kind: 'refused', overloaded: true, retryAfterMs: 1_000, limits: {}, elapsedMs: 20 },
      settings,
    );
    assert.equal(overloaded.overloads, 1);
    const { starts } = queue(overloaded, 1_000, 4, 1, settings);
    // A quarter of 10 a second right after the overload: 400 ms apart, not 100.
    assert.ok(
      starts[3]! - starts[2]! > 300,
      `after an overload calls come back slowly: ${starts.join(', ')}`,
    );
    const later = queue(overloaded, 2_000 + RAMP_MS, 4, 1, settings);
    assert.ok(
      later.starts[3]! - later.starts[2]! <= 100,
      `and climb back to the rate: ${later.starts.join(', ')}`,
    );
  });

  it("takes the provider's count of what is left over its own when the provider's is lower", () => {
    const settings = { tokensPerMinute: 60_000 };
    const { state } = queue(freshState(0), 0, 1, 1_000, settings);
    // The provider counted 5,000 tokens more than this fleet did (another client, or no refund of the cap).
    const { state: heard } = settle(
      state,
      0,
      {
        kind: 'answered',
        reservedTokens: 1_000,
        usedTokens: 1_000,
        limits: { tokens: { limit: 60_000, remaining: 54_000 } },
        elapsedMs: 0,
      },
      settings,
    );
    // 6,000 tokens of debt at 1,000 a second: the next call of 1,000 may start once it is down to the second's room.
    assert.equal(granted(reserve(heard, 0, { tokens: 1_000 }, settings, 0)).startAt, 6_000);
  });

  it('settles the tokens reserved against those used, both ways', () => {
    const settings = { tokensPerMinute: 60_000 };
    const { state } = queue(freshState(0), 0, 1, 3_000, settings);
    const { state: refund } = settle(
      state,
      0,
      { kind: 'answered', reservedTokens: 3_000, usedTokens: 1_000, limits: {}, elapsedMs: 0 },
      settings,
    );
    assert.equal(refund.tokensTat, 1_000);
  });

  it("admits a send only while the fleet's sends fit a one-second bucket of each limit", () => {
    const settings = { requestsPerMinute: 120, tokensPerMinute: 60_000 };
    let state = freshState(0);
    const send = (now: number, tokens: number) => {
      const answer = admit(state, now, { tokens }, settings);
      if (answer.kind === 'send') state = answer.state;
      return answer.kind === 'send' ? 'send' : answer.waitMs;
    };
    // A full bucket holds two requests (120 a minute): two late calls may go together, not a third.
    assert.equal(send(10_000, 100), 'send');
    assert.equal(send(10_000, 100), 'send');
    assert.equal(send(10_000, 100), 500);
    assert.equal(send(10_500, 100), 'send');
    // A call bigger than a second's tokens (1,000 at 60,000 a minute) waits for the full bucket.
    assert.equal(send(20_000, 1_500), 'send');
    assert.equal(send(20_000, 1_500), 1_500);
    // A refusal's Retry-After holds every send back.
    state = { ...state, blockedUntil: 40_000 };
    assert.equal(send(39_000, 1), 1_000);
    // The provider's count, when an answer gives it, replaces the fleet's own.
    state = settle(
      state,
      50_000,
      {
        kind: 'answered',
        reservedTokens: 10,
        usedTokens: 10,
        elapsedMs: 0,
        limits: { requests: { limit: 120, remaining: 0, resetMs: 1_000 } },
      },
      settings,
    ).state;
    assert.equal(send(50_000, 1), 500);
  });

  it('reads the limits from OpenAI and Anthropic headers, and learns characters a token', () => {
    assert.deepEqual(
      limitsFromHeaders(
        new Headers({
          'anthropic-ratelimit-requests-limit': '50',
          'anthropic-ratelimit-requests-remaining': '49',
          'anthropic-ratelimit-input-tokens-limit': '30000',
          'anthropic-ratelimit-input-tokens-remaining': '29000',
        }),
      ),
      { requests: { limit: 50, remaining: 49 }, tokens: { limit: 30_000, remaining: 29_000 } },
    );
    assert.deepEqual(limitsFromHeaders(new Headers({ 'content-type': 'application/json' })), {});
    assert.ok(Math.abs(calibrate(3.5, 4_000, 1_000) - 3.6) < 1e-9);
  });
});

interface Store {
  name: string;
  /** Two handles on one fresh store: two worker hosts. */
  open(): Promise<[SqlRateLimits, SqlRateLimits, () => Promise<void>]>;
}

const STORES: Store[] = [
  {
    name: 'SQLite file',
    open() {
      const file = path.join(scratchDir(defer, 'rate-limit-'), 'memo.db');
      const db = openSqlite(file, 'memo');
      return Promise.resolve([
        new SqlRateLimits(db),
        new SqlRateLimits(openSqlite(file, 'memo')),
        () => db.close(),
      ]);
    },
  },
  {
    name: 'PostgreSQL',
    async open() {
      const url = await freshSchema(defer);
      const a = await openPostgres(url);
      const b = await openPostgres(url);
      return [
        new SqlRateLimits(postgresSql(a)),
        new SqlRateLimits(postgresSql(b)),
        async () => {
          await a.end();
          await b.end();
        },
      ];
    },
  },
];

const hold = (holdKey: string, extra: Partial<Parameters<SqlRateLimits['reserve']>[0]> = {}) => ({
  scope: 'test/model@http://127.0.0.1:1',
  holdKey,
  tokens: 100,
  usd: 0.01,
  workflowId: `wf-${holdKey}`,
  leaseMs: 60_000,
  ...extra,
});

for (const store of STORES) {
  describe(`pacing in the shared store (${store.name})`, () => {
    it('two hosts asking at once get distinct turns, spaced by the limit', async () => {
      const [a, b, close] = await store.open();
      try {
        const settings = { requestsPerMinute: 600 };
        // Each turn as a time: when its answer came, plus its wait (measured from when the turn was given).
        const turns = await Promise.all(
          Array.from({ length: 20 }, async (_, i) => {
            const answer = await (i % 2 === 0 ? a : b).reserve(hold(`k${i}`), settings);
            assert.equal(answer.kind, 'granted');
            return Date.now() + (answer.kind === 'granted' ? answer.waitMs : NaN);
          }),
        );
        turns.sort((x, y) => x - y);
        const shown = turns.map((t) => t - turns[0]!).join(', ');
        // 10 a second, half a second's worth at once: 5 go at once, then one every 100 ms (less the noise of when
        // each answer came back), whatever host asked: 20 calls take ~1.5 s of turns.
        assert.ok(turns[19]! - turns[0]! > 1_200, `the last turn is ~1.5 s out: ${shown}`);
        assert.ok(turns[5]! - turns[0]! >= 60, `5 at once, then evenly: ${shown}`);
        // Past the first 5, the i-th turn comes no sooner than (i - 5) turns of 100 ms after the first (the
        // queue may catch up within its half second of slack, so single gaps can be shorter).
        for (let i = 6; i < 20; i++)
          assert.ok(turns[i]! - turns[0]! >= (i - 5) * 100 - 60, `turn ${i} came too soon: ${shown}`);
        const status = await a.status(hold('x').scope, settings);
        assert.equal(status?.waiting !== undefined && status.waiting > 0, true);
      } finally {
        await close();
      }
    });

    it("keeps a call's turn under its key across attempts, and counts its spending once", async () => {
      const [a, b, close] = await store.open();
      try {
        const budget = { id: `budget-${randomUUID()}`, usd: 0.05 };
        const first = await a.reserve(hold('same', { budget }), {});
        assert.equal(first.kind, 'granted');
        const again = await b.reserve(hold('same', { budget }), {});
        assert.equal(
          again.kind === 'granted' && first.kind === 'granted' && again.nonce === first.nonce,
          true,
        );
        if (first.kind !== 'granted') return;
        const end = { kind: 'unanswered' } as const;
        const spent = { tokens: 120, usd: 0.02 };
        await a.end(hold('same').scope, { holdKey: 'same', nonce: first.nonce }, end, {}, spent);
        // A repeat of the same ending (a statement retried after its commit) counts nothing.
        await b.end(hold('same').scope, { holdKey: 'same', nonce: first.nonce }, end, {}, spent);
        const after = await a.budget(budget.id);
        assert.equal(after?.spentTokens, 120);
        assert.ok(Math.abs((after?.spentUsd ?? 0) - 0.02) < 1e-9);
      } finally {
        await close();
      }
    });

    it('refuses a call that would pass its budget, lists the run, and wakes it when the budget is raised', async () => {
      const [a, b, close] = await store.open();
      try {
        const budget = { id: `budget-${randomUUID()}`, usd: 0.025 };
        const known = { requestsPerMinute: 60_000 };
        const one = await a.reserve(hold('one', { budget }), known);
        const two = await b.reserve(hold('two', { budget }), known);
        assert.equal(one.kind, 'granted');
        assert.equal(two.kind, 'granted');
        // 0.01 promised + 0.01 promised + 0.01 asked = 0.03 > 0.025, but nothing is spent yet: the call waits for
        // the promises to end, and its run is not listed (a raise is not what it needs).
        const early = await a.reserve(hold('three', { budget }), known);
        assert.equal(early.kind, 'promised');
        assert.deepEqual(await b.waitingBudgets(), []);
        // The first call spends 0.02 of what it promised: 0.02 spent + 0.01 asked = 0.03 > 0.025, whatever ends.
        if (one.kind !== 'granted') return;
        await a.end(hold('one').scope, { holdKey: 'one', nonce: one.nonce }, { kind: 'unanswered' }, known, {
          tokens: 100,
          usd: 0.02,
        });
        const three = await a.reserve(hold('three', { budget }), known);
        assert.equal(three.kind, 'budget');
        assert.deepEqual(
          (await b.waitingBudgets()).map((w) => w.workflowIds),
          [['wf-three']],
        );
        const raised = await b.setBudget(budget.id, { usd: 1 });
        assert.deepEqual(raised?.woken, ['wf-three']);
        assert.equal((await a.reserve(hold('three', { budget }), known)).kind, 'granted');
        assert.deepEqual(await b.waitingBudgets(), []);
      } finally {
        await close();
      }
    });

    it('calls woken together well past their turns (their process held up) go no faster than the limit allows', async () => {
      const [a, , close] = await store.open();
      try {
        const pacer = new Pacer(
          a,
          `test/held-up@http://127.0.0.1:1/${randomUUID()}`,
          { provider: 'test', model: 'held-up' },
          { leaseMs: 60_000, settings: { requestsPerMinute: 120 }, log: silentLogger },
        );
        const sent: number[] = [];
        const call = (i: number) =>
          pacer.run(
            {
              holdKey: `late-${i}`,
              workflowId: `wf-late-${i}`,
              step: 'summarize',
              attemptEndsAt: Infinity,
              stepEndsAt: Infinity,
              signal: new AbortController().signal,
            },
            {
              promptChars: 400,
              maxOutputTokens: 10,
              send: () => {
                sent.push(Date.now());
                return Promise.resolve({
                  value: i,
                  usage: { inputTokens: 100, outputTokens: 10 },
                  limits: {},
                });
              },
            },
          );
        // Turns half a second apart: the first goes at once, the others at 0.5, 1 and 1.5 s.
        const calls = [0, 1, 2, 3].map(call);
        const deadline = Date.now() + 10_000;
        while (sent.length === 0 && Date.now() < deadline) await sleep(10);
        // The process is held up for 1.7 s (a synchronous store call, a long GC): three turns pass meanwhile.
        const heldUntil = Date.now() + 1_700;
        while (Date.now() < heldUntil) {
          // busy, as a blocked event loop is
        }
        await Promise.all(calls);
        // Sent together, the calls whose turns passed would be a burst the provider's one-second bucket (two
        // requests at 120 a minute, one more each half second) refuses. Its rule, with 20 ms for the clocks.
        sent.sort((x, y) => x - y);
        let level = 2;
        for (let i = 0; i < sent.length; i++) {
          if (i > 0) level = Math.min(2, level + (sent[i]! - sent[i - 1]! + 20) / 500);
          assert.ok(
            level >= 1,
            `call ${i + 1} went with the bucket at ${level.toFixed(2)}: sent at ${sent.map((t) => t - sent[0]!).join(', ')} ms`,
          );
          level -= 1;
        }
      } finally {
        await close();
      }
    });

    it('caps the calls in flight across hosts', async () => {
      const [a, b, close] = await store.open();
      try {
        const settings = { maxConcurrent: 2 };
        // Known limits (a generous one), so no call waits to learn them.
        const limits = { ...settings, requestsPerMinute: 60_000 };
        assert.equal((await a.reserve(hold('c1'), limits)).kind, 'granted');
        assert.equal((await b.reserve(hold('c2'), limits)).kind, 'granted');
        const third = await a.reserve(hold('c3'), limits);
        assert.deepEqual(third, { kind: 'busy', retryInMs: 250, why: 'concurrency' });
      } finally {
        await close();
      }
    });
  });
}
