/**
 * The phase timing npm run bench reads its breakdown from (src/telemetry/phases.ts): each step marks the phases it
 * went through into the phase context its execution runs in, a memo hit marks no model call, a step outside any
 * context records nothing and still works, and a worker with the phase-timing interceptor opens a context for each
 * activity execution.
 */
import { before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Context } from '@temporalio/activity';
import { MockActivityEnvironment } from '@temporalio/testing';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger } from '@temporalio/worker';
import { pipelineActivities } from '../src/cli/compose';
import { timingPhases } from '../src/telemetry/phases';
import type { Phase, PhaseTimer } from '../src/telemetry/phases';
import type { documentPipeline } from '../workflows';
import {
  installQuietRuntime,
  pipelineInput,
  SAMPLE_TEXT,
  tempParts,
  pipelineWorker,
  timeSkippingEnv,
} from './helpers';
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

describe('phase timing', () => {
  it('a model step marks its input check, text read, memo claim, model call and memo answer', async () => {
    const local = await tempParts(defer);
    const timer = recorder();
    const { summarize } = pipelineActivities(local.deps);
    const input = {
      documentId: 'doc-1',
      textRef: await local.blobs.put(Buffer.from(SAMPLE_TEXT)),
      maxSentences: 2,
    };
    await timingPhases(timer, () => runStep('summarize', randomUUID(), summarize, input));
    assert.deepEqual(timer.phases, ['input check', 'text read', 'memo claim', 'model call', 'memo answer']);

    // A second run finds the answer in the memo: no model call, no answer stored.
    timer.phases.length = 0;
    const again = await timingPhases(timer, () => runStep('summarize', randomUUID(), summarize, input));
    assert.equal(again.memoised, true);
    assert.deepEqual(timer.phases, ['input check', 'text read', 'memo claim']);
  });

  it('publish marks its input check and the publication', async () => {
    const local = await tempParts(defer);
    const timer = recorder();
    const { publish } = pipelineActivities(local.deps);
    const input = {
      documentId: 'doc-1',
      title: 'Checkpoints',
      textRef: await local.blobs.put(Buffer.from(SAMPLE_TEXT)),
      summary: 'A short summary.',
      tags: ['checkpoints'],
      model: { provider: 'offline', model: 'extractive' },
    };
    await timingPhases(timer, () => runStep('publish', randomUUID(), publish, input));
    assert.deepEqual(timer.phases, ['input check', 'publication']);
  });

  it('a step outside any phase context records nothing, while another step is timed beside it', async () => {
    const local = await tempParts(defer);
    const timer = recorder();
    const { tag } = pipelineActivities(local.deps);
    // Two texts, so two memo entries: each step claims its own and calls the model.
    const input = async (text: string) => ({
      documentId: 'doc-1',
      textRef: await local.blobs.put(Buffer.from(text)),
      maxTags: 3,
    });
    const [one, other] = [await input(SAMPLE_TEXT), await input(`${SAMPLE_TEXT}\nOne paragraph more.`)];
    const [untimed, timed] = await Promise.all([
      runStep('tag', randomUUID(), tag, one),
      timingPhases(timer, () => runStep('tag', randomUUID(), tag, other)),
    ]);
    assert.ok(untimed.tags.length > 0 && timed.tags.length > 0);
    assert.deepEqual(timer.phases, ['input check', 'text read', 'memo claim', 'model call', 'memo answer']);
  });
});

describe('phase timing on a worker', () => {
  let env: TestWorkflowEnvironment;

  before(async () => {
    installQuietRuntime();
    env = await timeSkippingEnv(defer);
  });

  it('times the phases of every step of a run, each in its own activity execution', async () => {
    const local = await tempParts(defer);
    // Recorded by step: the timer is called inside the activity execution that marked the phase.
    const byStep: Record<string, Phase[]> = {};
    const timer: PhaseTimer = {
      record(phase, ms) {
        assert.ok(ms >= 0, `${phase} took ${ms} ms`);
        (byStep[Context.current().info.activityType] ??= []).push(phase);
      },
    };
    const taskQueue = `phases-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps, { phases: timer });
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
    const result = await worker.runUntil(
      env.client.workflow.execute<typeof documentPipeline>('documentPipeline', {
        taskQueue,
        workflowId: `wf-${randomUUID()}`,
        args: [input],
      }),
    );
    assert.equal(result.publication?.duplicate, false);
    const modelStep: Phase[] = ['input check', 'text read', 'memo claim', 'model call', 'memo answer'];
    assert.deepEqual(byStep, {
      summarize: modelStep,
      tag: modelStep,
      publish: ['input check', 'publication'],
    });
  });
});
