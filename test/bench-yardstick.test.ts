/**
 * The busy yardstick's thread (scripts/bench/spin-thread.ts) stands for the offline model's CPU work: it must spin
 * for time on its core, so that a thread descheduled meanwhile (two shared cores, the server and the worker's
 * thread on them) finishes later, as the model's scoring does, instead of on the wall clock.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
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
