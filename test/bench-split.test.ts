/**
 * The pairs' history split (bench/lib/paired.ts): `npm run bench` cuts each run of the pipeline and of the busy
 * yardstick where the pipeline's shape turns, to say where in a run the project's own cost lies; and the stretch
 * before a run's first step, where the pipeline's patch puts its marker and search-attribute upsert.
 */
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { historyFromJSON } from '@temporalio/common/lib/proto-utils';
import { temporal } from '@temporalio/proto';
import { segmentsOf, untilFirstStep } from '../bench/lib/paired';

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

  it("times a run's start to its first step, with the patch's marker and upsert inside it", () => {
    const { EventType } = temporal.api.enums.v1;
    const recorded = history('parallel-tidal-energy');
    const events = recorded.events ?? [];
    const first = events.find((e) => e.eventType === EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED);
    const stretch = untilFirstStep(recorded);
    assert.ok(stretch !== undefined && first !== undefined);
    assert.ok(Math.abs(stretch - (ms(first) - ms(events[0]))) < 0.01, `${stretch} ms`);
    const patch = events.filter(
      (e) =>
        e.eventType === EventType.EVENT_TYPE_MARKER_RECORDED ||
        e.eventType === EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    );
    assert.equal(patch.length, 2, "the recorded run does not carry the patch's two events");
    for (const e of patch) assert.ok(ms(e) <= ms(first), 'a patch event came after the first step');
    // A run whose first workflow task has not scheduled anything yet has no such stretch.
    const cut = { events: events.slice(0, events.indexOf(first)) };
    assert.equal(untilFirstStep(cut), undefined);
  });
});
