/**
 * The recovery report's words and figures, read from a history built here: time lost is wall time (two steps
 * that waited side by side after one crash lose it once), and a finished document submitted again is reported as
 * already done earlier, not as a run that resumed.
 */
import '../src/cli/compose';
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { msToTs } from '@temporalio/common/lib/time';
import { temporal } from '@temporalio/proto';
import { recoveryReport } from '../src/runs/history';
import { describeStep, summarizeReports } from '../src/runs/step-outcome';

const T0 = Date.UTC(2025, 0, 1, 12, 0, 0);
const at = (seconds: number) => msToTs(T0 + seconds * 1000);

/**
 * A run whose summarize and tag (scheduled together) were cut off by a crash and retried 10 s later on attempt 2,
 * then published once, completing 12 s after it started.
 */
function crashedAndFinished(): temporal.api.history.v1.IHistory {
  let id = 0;
  const event = (seconds: number, fields: Record<string, unknown>): Record<string, unknown> => ({
    eventId: ++id,
    eventTime: at(seconds),
    ...fields,
  });
  return temporal.api.history.v1.History.fromObject({
    events: [
      event(0, { workflowExecutionStartedEventAttributes: { originalExecutionRunId: 'run-1' } }),
      event(0, { activityTaskScheduledEventAttributes: { activityId: 'summarize' } }),
      event(0, { activityTaskScheduledEventAttributes: { activityId: 'tag' } }),
      event(10, { activityTaskStartedEventAttributes: { scheduledEventId: 2, attempt: 2, identity: 'w2' } }),
      event(10, { activityTaskStartedEventAttributes: { scheduledEventId: 3, attempt: 2, identity: 'w2' } }),
      event(11, { activityTaskCompletedEventAttributes: { scheduledEventId: 2 } }),
      event(11, { activityTaskCompletedEventAttributes: { scheduledEventId: 3 } }),
      event(11, { activityTaskScheduledEventAttributes: { activityId: 'publish' } }),
      event(11, { activityTaskStartedEventAttributes: { scheduledEventId: 8, attempt: 1, identity: 'w2' } }),
      event(12, { activityTaskCompletedEventAttributes: { scheduledEventId: 8 } }),
      event(12, { workflowExecutionCompletedEventAttributes: {} }),
    ],
  });
}

describe('the recovery report', () => {
  it('counts the wall time lost, not the sum of the steps that waited side by side', () => {
    const report = recoveryReport(crashedAndFinished(), T0 - 1_000);
    assert.deepEqual(
      report.steps.map((s) => s.timeLostMs),
      [10_000, 10_000, 0],
    );
    const summary = summarizeReports([report, recoveryReport(crashedAndFinished(), T0 - 1_000)]);
    assert.match(summary, /4 rerun after a failure \(10\.0 s of wall time lost\)/, summary);
  });

  it('reports the steps of a run that had ended before this session as already done earlier, not skipped on resume', () => {
    const report = recoveryReport(crashedAndFinished(), T0 + 60_000);
    assert.deepEqual(
      report.steps.map((s) => describeStep(s)),
      ['already done earlier', 'already done earlier', 'already done earlier'],
    );
    const summary = summarizeReports([report]);
    assert.match(
      summary,
      /^Recovery: 3 step\(s\) already done earlier \(finished runs, not run again\), 0 step\(s\) skipped on resume/,
    );
  });

  it('still reports steps finished before this session in a run that was open then as skipped on resume', () => {
    const report = recoveryReport(crashedAndFinished(), T0 + 11_500);
    assert.deepEqual(
      report.steps.map((s) => describeStep(s)),
      ['done earlier, skipped on resume', 'done earlier, skipped on resume', 'ran once'],
    );
  });
});
