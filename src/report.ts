import type { temporal } from '@temporalio/proto';
import { defaultPayloadConverter } from '@temporalio/common';
import { optionalTsToMs } from '@temporalio/common/lib/time';
import { z } from 'zod';
import { STEPS } from './shared';
import type { StepName } from './shared';

type History = temporal.api.history.v1.IHistory;

export interface StepReport {
  step: StepName;
  status: 'not started' | 'running' | 'completed' | 'failed' | 'timed out';
  /** Attempts made, from the last recorded start (Temporal records only the final attempt's start event). */
  attempts: number;
  /** Worker identity that ran the recorded (final) attempt. */
  worker: string | undefined;
  /** Why the attempt before the final one failed, e.g. a heartbeat timeout after a worker was killed. */
  lastFailure: string | undefined;
  idempotencyKey: string | undefined;
  scheduledAt: number | undefined;
  completedAt: number | undefined;
  /** Wall time between scheduling and the final attempt's start: failed attempts, timeouts and backoff. */
  timeLostMs: number;
  /** True when the step's completion is recorded before `since`: a resumed run skipped it. */
  skippedOnResume: boolean;
  /** True when the result says the model answer came from the durable memo (paid for once, reused). */
  memoised: boolean;
}

export interface RecoveryReport {
  runId: string | undefined;
  steps: StepReport[];
  /** Every worker identity that processed a workflow task or an activity of this run. */
  workers: string[];
}

const ResultFlagsSchema = z.object({
  memoised: z.boolean().optional(),
  idempotencyKey: z.string().optional(),
});

/**
 * Reads what happened to each step from the run's event history, the one source of truth; no second bookkeeping
 * store. `since` marks the start of the current session: steps completed before it were skipped on resume.
 */
export function recoveryReport(history: History, since = Number.POSITIVE_INFINITY): RecoveryReport {
  const events = history.events ?? [];
  const started = events[0]?.workflowExecutionStartedEventAttributes;
  const runId = started?.originalExecutionRunId ?? undefined;
  const bySchedule = new Map<string, StepReport>();
  const workers = new Set<string>();
  const reports = new Map<StepName, StepReport>();

  for (const event of events) {
    const id = String(event.eventId ?? '');
    const time = optionalTsToMs(event.eventTime);
    const scheduled = event.activityTaskScheduledEventAttributes;
    if (scheduled) {
      const step = STEPS.find((s) => s === scheduled.activityId);
      if (step === undefined) continue;
      const report: StepReport = {
        step,
        status: 'running',
        attempts: 0,
        worker: undefined,
        lastFailure: undefined,
        idempotencyKey: runId !== undefined ? `${runId}:${step}` : undefined,
        scheduledAt: time,
        completedAt: undefined,
        timeLostMs: 0,
        skippedOnResume: false,
        memoised: false,
      };
      bySchedule.set(id, report);
      reports.set(step, report);
      continue;
    }
    const startedAttrs = event.activityTaskStartedEventAttributes;
    if (startedAttrs) {
      const report = bySchedule.get(String(startedAttrs.scheduledEventId ?? ''));
      if (!report) continue;
      report.attempts = startedAttrs.attempt ?? 1;
      report.worker = startedAttrs.identity ?? undefined;
      report.lastFailure = startedAttrs.lastFailure?.message ?? undefined;
      if (time !== undefined && report.scheduledAt !== undefined)
        report.timeLostMs = time - report.scheduledAt;
      if (report.worker) workers.add(report.worker);
      continue;
    }
    const completed = event.activityTaskCompletedEventAttributes;
    if (completed) {
      const report = bySchedule.get(String(completed.scheduledEventId ?? ''));
      if (!report) continue;
      report.status = 'completed';
      report.completedAt = time;
      report.skippedOnResume = time !== undefined && time < since;
      const payload = completed.result?.payloads?.[0];
      const flags = ResultFlagsSchema.safeParse(payload ? safeDecode(payload) : undefined);
      if (flags.success) {
        report.memoised = flags.data.memoised ?? false;
        report.idempotencyKey = flags.data.idempotencyKey ?? report.idempotencyKey;
      }
      continue;
    }
    const failed = event.activityTaskFailedEventAttributes;
    if (failed) {
      const report = bySchedule.get(String(failed.scheduledEventId ?? ''));
      if (report) {
        report.status = 'failed';
        report.completedAt = time;
        report.lastFailure = failed.failure?.message ?? report.lastFailure;
      }
      continue;
    }
    const timedOut = event.activityTaskTimedOutEventAttributes;
    if (timedOut) {
      const report = bySchedule.get(String(timedOut.scheduledEventId ?? ''));
      if (report) {
        report.status = 'timed out';
        report.completedAt = time;
        report.lastFailure = timedOut.failure?.message ?? report.lastFailure;
      }
      continue;
    }
    const identity = event.workflowTaskCompletedEventAttributes?.identity;
    if (identity) workers.add(identity);
  }

  const steps = STEPS.map(
    (step): StepReport =>
      reports.get(step) ?? {
        step,
        status: 'not started',
        attempts: 0,
        worker: undefined,
        lastFailure: undefined,
        idempotencyKey: undefined,
        scheduledAt: undefined,
        completedAt: undefined,
        timeLostMs: 0,
        skippedOnResume: false,
        memoised: false,
      },
  );
  return { runId, steps, workers: [...workers] };
}

/** How the step fared, in a few words: skipped on resume, reused from the memo, rerun after a failure, ran once. */
export function describeStep(step: StepReport): string {
  if (step.status !== 'completed') return step.status;
  if (step.skippedOnResume) return 'done earlier, skipped on resume';
  if (step.memoised) return `reused memoised answer (attempt ${step.attempts})`;
  if (step.attempts > 1) return `rerun, attempt ${step.attempts}`;
  return 'ran once';
}

/** The one-line summary for `npm start`: how many steps were skipped, rerun, or reused from the memo. */
export function summarizeReports(reports: readonly RecoveryReport[]): string {
  const all = reports.flatMap((r) => r.steps);
  const skipped = all.filter((s) => s.skippedOnResume).length;
  const rerun = all.filter((s) => !s.skippedOnResume && s.attempts > 1).length;
  const memo = all.filter((s) => s.memoised).length;
  const lost = all.reduce((sum, s) => sum + (s.attempts > 1 ? s.timeLostMs : 0), 0);
  return (
    `Recovery: ${skipped} step(s) skipped on resume, ${rerun} rerun after a failure ` +
    `(${(lost / 1000).toFixed(1)} s lost), ${memo} model answer(s) reused from the memo.`
  );
}

function safeDecode(payload: temporal.api.common.v1.IPayload): unknown {
  try {
    return defaultPayloadConverter.fromPayload(payload);
  } catch {
    return undefined;
  }
}
