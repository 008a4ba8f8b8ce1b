/**
 * The phase timer npm run bench reads its breakdown from (activities/phases.ts): each step reports the phases it
 * went through, a memo hit reports no model call, and a step without a timer records nothing and still works.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { MockActivityEnvironment } from '@temporalio/testing';
import { DefaultLogger } from '@temporalio/worker';
import { createActivities } from '../activities';
import type { Phase, PhaseTimer } from '../activities/phases';
import { SAMPLE_TEXT, tempParts } from './helpers';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();

/** A timer that keeps the phases in the order they ended, each with a time that must not be negative. */
function recorder(): PhaseTimer & { phases: Phase[] } {
  const phases: Phase[] = [];
  return {
    phases,
    record(phase, ms) {
      assert.ok(ms >= 0, `${phase} took ${ms} ms`);
      phases.push(phase);
    },
  };
}

/** Runs `fn` as attempt 1 of step `activityId` of run `runId`. */
function runStep<A extends unknown[], R>(
  activityId: string,
  runId: string,
  fn: (...args: A) => Promise<R>,
  ...args: A
): Promise<R> {
  const env = new MockActivityEnvironment(
    { activityId, workflowExecution: { workflowId: 'phases-test', runId }, attempt: 1 },
    { logger: new DefaultLogger('ERROR') },
  );
  return env.run<A, R, typeof fn>(fn, ...args);
}

describe('phase timer', () => {
  it('a model step reports its input check, text read, memo claim, model call and memo answer', async () => {
    const local = await tempParts(defer);
    const timer = recorder();
    const { summarize } = createActivities({ ...local.deps, phases: timer });
    const input = {
      documentId: 'doc-1',
      textRef: await local.blobs.put(Buffer.from(SAMPLE_TEXT)),
      maxSentences: 2,
    };
    await runStep('summarize', randomUUID(), summarize, input);
    assert.deepEqual(timer.phases, ['input check', 'text read', 'memo claim', 'model call', 'memo answer']);

    // A second run finds the answer in the memo: no model call, no answer stored.
    timer.phases.length = 0;
    const again = await runStep('summarize', randomUUID(), summarize, input);
    assert.equal(again.memoised, true);
    assert.deepEqual(timer.phases, ['input check', 'text read', 'memo claim']);
  });

  it('publish reports its input check and the publication', async () => {
    const local = await tempParts(defer);
    const timer = recorder();
    const { publish } = createActivities({ ...local.deps, phases: timer });
    await runStep('publish', randomUUID(), publish, {
      documentId: 'doc-1',
      title: 'Checkpoints',
      textRef: await local.blobs.put(Buffer.from(SAMPLE_TEXT)),
      summary: 'A short summary.',
      tags: ['checkpoints'],
      model: { provider: 'offline', model: 'extractive' },
    });
    assert.deepEqual(timer.phases, ['input check', 'publication']);
  });

  it('a worker without a timer records nothing and runs its steps as before', async () => {
    const local = await tempParts(defer);
    const { tag } = createActivities(local.deps);
    const input = {
      documentId: 'doc-1',
      textRef: await local.blobs.put(Buffer.from(SAMPLE_TEXT)),
      maxTags: 3,
    };
    const result = await runStep('tag', randomUUID(), tag, input);
    assert.ok(result.tags.length > 0);
    assert.equal(local.deps.phases, undefined);
  });
});
