/**
 * The busy yardstick's thread (scripts/bench/spin-thread.ts) stands for the offline model's CPU work: it must spin
 * for time on its core, so that a thread descheduled meanwhile (two shared cores, the server and the worker's
 * thread on them) finishes later, as the model's scoring does, instead of on the wall clock. The pairs' history
 * split (scripts/bench/paired.ts) cuts a run where the pipeline's shape turns.
 */
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { historyFromJSON } from '@temporalio/common/lib/proto-utils';
import { segmentsOf } from '../scripts/bench/paired';
import { spin } from '../scripts/bench/spin-thread';

/** A wall clock that moves 10 µs a look, and jumps `gapMs` at look number `gapAt`: the thread was off its core. */
function clockWithGap(gapAt: number, gapMs: number): { clock: () => number; now: () => number } {
  let looks = 0;
  let now = 0;
  return {
    clock: () => {
      looks += 1;
      now += looks === gapAt ? gapMs : 0.01;
      return now;
    },
    now: () => now,
  };
}

describe("the busy yardstick's spin", () => {
  it('counts only the time on its core: a gap while descheduled does not count', () => {
    const { clock, now } = clockWithGap(50, 5);
    spin({ ms: 2 }, clock);
    // 2 ms on the core and the 5 ms gap: it ends past 7 ms of wall clock, not at 2.
    assert.ok(now() >= 7, `the spin ended at ${now()} ms of wall clock, counting the gap as work`);
    assert.ok(now() < 7.1, `the spin ran on to ${now()} ms`);
  });

  it('on a core of its own, ends when the time asked has passed', () => {
    const { clock, now } = clockWithGap(-1, 0);
    spin({ ms: 3 }, clock);
    assert.ok(now() >= 3 && now() < 3.1, `the spin ended at ${now()} ms`);
  });
});

describe("the pairs' history split", () => {
  const history = (name: string) =>
    historyFromJSON(JSON.parse(fs.readFileSync(path.join(__dirname, 'histories', `${name}.json`), 'utf8')));
  const ms = (e: { eventTime?: { seconds?: unknown; nanos?: number | null } | null } | undefined) =>
    Number(e?.eventTime?.seconds ?? 0) * 1000 + (e?.eventTime?.nanos ?? 0) / 1e6;

  it("cuts a run into the pipeline's five segments, which add up to the run", () => {
    const recorded = history('parallel-tidal-energy');
    const split = segmentsOf(recorded);
    assert.ok(split !== undefined, 'a completed run of the pipeline was not split');
    const events = recorded.events ?? [];
    const total = ms(events.at(-1)) - ms(events[0]);
    const sum = Object.values(split).reduce((a, b) => a + b, 0);
    assert.ok(Math.abs(sum - total) < 0.01, `the segments add up to ${sum} ms, the run took ${total}`);
    for (const [name, value] of Object.entries(split)) assert.ok(value >= 0, `${name}: ${value} ms`);
    assert.ok(split['summarize and tag'] > 0, 'the model steps took no time');
  });

  it('leaves out a run of another shape', () => {
    assert.equal(segmentsOf(history('parallel-missing-text')), undefined);
  });
});
