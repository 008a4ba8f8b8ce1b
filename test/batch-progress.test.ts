/**
 * The batch's progress on a pipe or in a log file: a line per tenth of the batch (not per poll), and each failure
 * once, however often the batch repeats it.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  ActivityFailure,
  ApplicationFailure,
  ChildWorkflowFailure,
  RetryState,
  TimeoutFailure,
  TimeoutType,
} from '@temporalio/common';
import { describeFailure, emptyTally } from '../src/contract/batch';
import type { BatchFailure, BatchProgress } from '../src/contract/batch';
import { BatchProgressDisplay } from '../src/runs/batch-progress';

function progress(ended: number, failures: BatchFailure[] = []): BatchProgress {
  // `ended` documents: those failed among them.
  const tally = { ...emptyTally(), done: ended - failures.length, failed: failures.length };
  return {
    total: 100,
    started: ended,
    running: 4,
    tally,
    failures,
    unlistedFailures: 0,
    runs: 1,
    open: [],
    handled: [],
  };
}

describe('the batch progress display without a terminal', () => {
  it('prints a line per tenth and each failure once', () => {
    const lines: string[] = [];
    const display = new BatchProgressDisplay(100, { print: (l) => lines.push(l) });
    const failure: BatchFailure = {
      seq: 1,
      source: 'a.md',
      workflowId: 'document-a',
      step: 'tag',
      reason: 'boom',
    };
    for (let done = 0; done <= 99; done++) display.update(progress(done, done >= 50 ? [failure] : []));
    display.stop();

    const progressLines = lines.filter((l) => l.startsWith('progress: '));
    // The first document's end, then each tenth.
    assert.deepEqual(
      progressLines.map((l) => Number(/^progress: (\d+)\//.exec(l)?.[1])),
      [1, 10, 20, 30, 40, 50, 60, 70, 80, 90],
    );
    assert.match(
      progressLines[1] ?? '',
      /^progress: 10\/100 documents ended \(0 failed\), [\d.]+ docs\/s,( ETA \d+ s,)? 4 running$/,
    );
    assert.deepEqual(
      lines.filter((l) => l.startsWith('FAILED')),
      ['FAILED a.md: tag: boom'],
    );
    assert.equal(display.seenFailures, 1);
  });
});

describe("a failed document's one line", () => {
  // A run that failed at a step fails with the step's ActivityFailure; its parent sees it inside a ChildWorkflowFailure.
  const inChild = (cause: Error): Error =>
    new ChildWorkflowFailure(
      'default',
      { workflowId: 'document-x', runId: 'r' },
      'documentPipeline',
      RetryState.NON_RETRYABLE_FAILURE,
      new ActivityFailure('Activity task failed', 'tag', 'tag', RetryState.NON_RETRYABLE_FAILURE, 'w', cause),
    );

  it('says what ended the step for good, not the message its last attempt wrote while a retry was to come', () => {
    const last = ApplicationFailure.create({
      type: 'TransientModelError',
      message: 'request failed (ENOTFOUND)',
    });
    const exhausted = ApplicationFailure.create({
      type: 'ProviderErrorsExhausted',
      nonRetryable: true,
      message:
        'tag failed after 6 attempts (provider errors in this run; MAX_PROVIDER_ERRORS is 6): request failed',
      cause: last,
    });
    assert.deepEqual(describeFailure(inChild(exhausted)), { reason: exhausted.message, step: 'tag' });
  });

  it("names a step whose budget ran out, with its last attempt's error", () => {
    const budget = new TimeoutFailure(
      'activity ScheduleToClose timeout',
      undefined,
      TimeoutType.SCHEDULE_TO_CLOSE,
    );
    Object.defineProperty(budget, 'cause', { value: new Error('publish webhook answered HTTP 503') });
    assert.deepEqual(describeFailure(inChild(budget)), {
      reason:
        "the step's budget (STEP_BUDGET_MINUTES) ran out; the last attempt: publish webhook answered HTTP 503",
      step: 'tag',
    });
  });
});
