import { temporal } from '@temporalio/proto';
import { defaultPayloadConverter } from '@temporalio/common';
import { optionalTsToMs } from '@temporalio/common/lib/time';
import { z } from 'zod';
import { UsageSchema } from '../contract';
import { stepNames } from '../steps/registry';
import type { StepName, Usage } from '../contract';

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
  /** True when the step's completion is recorded before `since` in a run still open then: a resumed run skipped it. */
  skippedOnResume: boolean;
  /**
   * True when the whole run had ended before `since`: a finished document submitted again, whose results are read
   * back; nothing resumed and nothing ran.
   */
  doneEarlier: boolean;
  /** True when the result says the model answer came from the durable memo (paid for once, reused). */
  memoised: boolean;
  /** Model steps: tokens in/out from the provider's usage fields, as recorded in the step's result. */
  usage: Usage | undefined;
  /** Model steps: tokens of paid answers the step refused before the one it kept. */
  rejectedUsage: Usage | undefined;
  /** Model steps: estimated cost in US dollars; null when the model has no price. */
  estimatedCostUsd: number | null | undefined;
  /** Model steps answered by a provider batch (bulk mode): its claim, and the cost one call would have had. */
  bulk?: { claim: string; listCostUsd: number | null } | undefined;
  /** Model steps: the step's identity when it was asked (src/steps/identity.ts). */
  identity?: string | undefined;
  /** Model steps asked again because the step changed: the identity of the document's earlier answer. */
  changedFrom?: string | undefined;
  /** Publish, to the publication store: whether the publication differs from the document's previous revision. */
  changed?: boolean | undefined;
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
  usage: UsageSchema.optional(),
  rejectedUsage: UsageSchema.optional(),
  estimatedCostUsd: z.number().nullable().optional(),
  bulk: z.object({ claim: z.string(), listCostUsd: z.number().nullable() }).optional(),
  identity: z.string().optional(),
  changedFrom: z.string().optional(),
  changed: z.boolean().optional(),
});

/**
 * Reads what happened to each step from the run's event history, the one source of truth; no second bookkeeping
 * store. `since` marks the start of the current session: steps completed before it were skipped on resume, or,
 * when the whole run had ended before it, done earlier.
 */
export function recoveryReport(history: History, since = 0, knownRunId?: string): RecoveryReport {
  const events = history.events ?? [];
  const outcome = runOutcome(events);
  const endedEarlier =
    outcome.status !== 'running' && outcome.closedAt !== undefined && outcome.closedAt < since;
  const started = events[0]?.workflowExecutionStartedEventAttributes;
  // A reset run keeps the original run's ID in its started event: prefer the run ID the caller knows.
  const runId = knownRunId ?? started?.originalExecutionRunId ?? undefined;
  const bySchedule = new Map<string, StepReport>();
  const workers = new Set<string>();
  const reports = new Map<StepName, StepReport>();

  for (const event of events) {
    const id = String(event.eventId ?? '');
    const time = optionalTsToMs(event.eventTime);
    const scheduled = event.activityTaskScheduledEventAttributes;
    if (scheduled) {
      const step = stepNames().find((s) => s === scheduled.activityId);
      if (step === undefined) continue;
      const report: StepReport = {
        ...notStarted(step),
        status: 'running',
        idempotencyKey: runId !== undefined ? `${runId}:${step}` : undefined,
        scheduledAt: time,
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
      const before = time !== undefined && time < since;
      report.doneEarlier = before && endedEarlier;
      report.skippedOnResume = before && !endedEarlier;
      const payload = completed.result?.payloads?.[0];
      const flags = ResultFlagsSchema.safeParse(payload ? safeDecode(payload) : undefined);
      if (flags.success) {
        report.memoised = flags.data.memoised ?? false;
        report.usage = flags.data.usage;
        report.rejectedUsage = flags.data.rejectedUsage;
        report.estimatedCostUsd = flags.data.estimatedCostUsd;
        if (flags.data.bulk !== undefined) report.bulk = flags.data.bulk;
        if (flags.data.identity !== undefined) report.identity = flags.data.identity;
        if (flags.data.changedFrom !== undefined) report.changedFrom = flags.data.changedFrom;
        if (flags.data.changed !== undefined) report.changed = flags.data.changed;
        report.idempotencyKey = flags.data.idempotencyKey ?? report.idempotencyKey;
      }
      continue;
    }
    const ended = event.activityTaskFailedEventAttributes ?? event.activityTaskTimedOutEventAttributes;
    if (ended) {
      const report = bySchedule.get(String(ended.scheduledEventId ?? ''));
      if (report) {
        report.status = event.activityTaskFailedEventAttributes ? 'failed' : 'timed out';
        report.completedAt = time;
        report.lastFailure = ended.failure?.message ?? report.lastFailure;
      }
      continue;
    }
    const identity = event.workflowTaskCompletedEventAttributes?.identity;
    if (identity) workers.add(identity);
  }

  const steps = stepNames().map((step) => reports.get(step) ?? notStarted(step));
  return { runId, steps, workers: [...workers] };
}

/**
 * The wall time the given steps lost to failed attempts, timeouts and backoff: the union of their lost intervals
 * (scheduled until the recorded attempt started), so steps that waited side by side, like summarize and tag after
 * one crash, count once.
 */
export function lostWallTimeMs(steps: readonly StepReport[]): number {
  const intervals = steps
    .flatMap((s) =>
      s.scheduledAt !== undefined && s.timeLostMs > 0 ? [[s.scheduledAt, s.scheduledAt + s.timeLostMs]] : [],
    )
    .sort((a, b) => (a[0] ?? 0) - (b[0] ?? 0));
  let total = 0;
  let end = -Infinity;
  for (const [from = 0, to = 0] of intervals) {
    if (to <= end) continue;
    total += to - Math.max(from, end);
    end = to;
  }
  return total;
}

function notStarted(step: StepName): StepReport {
  return {
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
    doneEarlier: false,
    memoised: false,
    usage: undefined,
    rejectedUsage: undefined,
    estimatedCostUsd: undefined,
  };
}

/** A payload decoded as JSON, or undefined when it cannot be. */
export function safeDecode(payload: temporal.api.common.v1.IPayload): unknown {
  try {
    return defaultPayloadConverter.fromPayload(payload);
  } catch {
    return undefined;
  }
}

type HistoryEvent = temporal.api.history.v1.IHistoryEvent;
type Failure = temporal.api.failure.v1.IFailure;

/** How the run as a whole ended, from its closing event; `running` while it has none. */
export interface RunOutcome {
  status: 'running' | 'completed' | 'failed' | 'timed out' | 'terminated' | 'canceled' | 'continued as new';
  startedAt: number | undefined;
  closedAt: number | undefined;
  /** The innermost failure message, for a run that failed, timed out or was terminated. */
  failure: string | undefined;
}

/** A workflow task completed by a different worker than the one before: it replayed the history to resume. */
export interface Takeover {
  at: number | undefined;
  from: string;
  to: string;
  /**
   * The worker before had gone without finishing its work: a workflow task or an activity attempt of the run timed
   * out since its last task. False for a hand-off (a worker that stopped cleanly, as npm start's does at a review).
   */
  lost: boolean;
}

/** A step's attempt still open on the server (from DescribeWorkflowExecution), for a run that has not ended. */
export interface PendingStep {
  step: StepName;
  /** The attempt under way or, when backing off, the next one. */
  attempt: number;
  state: 'scheduled' | 'started' | 'cancel requested' | 'paused' | 'pause requested' | 'unknown';
  lastWorker: string | undefined;
  lastFailure: string | undefined;
}

/** Everything beyond the per-step figures that the report command shows. */
export interface RunDetails {
  outcome: RunOutcome;
  takeovers: Takeover[];
  /** Every worker identity the history names: workflow tasks started or completed, activity attempts recorded. */
  identities: string[];
  /** The publish step's receipt, when recorded: `duplicate` means a retry was answered with the first receipt. */
  publication: { revision: number; duplicate: boolean; superseded?: boolean | undefined } | undefined;
}

const PublishFlagsSchema = z.object({
  revision: z.number(),
  duplicate: z.boolean(),
  superseded: z.boolean().optional(),
});

/** Reads the run's outcome, worker takeovers and identities from its history. */
export function runDetails(history: History): RunDetails {
  const events = history.events ?? [];
  const identities = new Set<string>();
  const takeovers: Takeover[] = [];
  let lastTaskWorker: string | undefined;
  let publication: RunDetails['publication'];
  const publishSchedules = new Set<string>();
  let timedOutSince = false;
  for (const event of events) {
    if (event.workflowTaskTimedOutEventAttributes || event.activityTaskTimedOutEventAttributes)
      timedOutSince = true;
    const taskStarted = event.workflowTaskStartedEventAttributes?.identity;
    if (taskStarted) identities.add(taskStarted);
    const activityStarted = event.activityTaskStartedEventAttributes?.identity;
    if (activityStarted) identities.add(activityStarted);
    if (event.activityTaskScheduledEventAttributes?.activityId === 'publish')
      publishSchedules.add(String(event.eventId ?? ''));
    const completed = event.activityTaskCompletedEventAttributes;
    if (completed && publishSchedules.has(String(completed.scheduledEventId ?? ''))) {
      const payload = completed.result?.payloads?.[0];
      const flags = PublishFlagsSchema.safeParse(payload ? safeDecode(payload) : undefined);
      if (flags.success) publication = flags.data;
    }
    const taskWorker = event.workflowTaskCompletedEventAttributes?.identity;
    if (taskWorker) {
      identities.add(taskWorker);
      if (lastTaskWorker !== undefined && taskWorker !== lastTaskWorker) {
        takeovers.push({
          at: optionalTsToMs(event.eventTime),
          from: lastTaskWorker,
          to: taskWorker,
          lost: timedOutSince,
        });
      }
      lastTaskWorker = taskWorker;
      timedOutSince = false;
    }
  }
  return { outcome: runOutcome(events), takeovers, identities: [...identities], publication };
}

function runOutcome(events: readonly HistoryEvent[]): RunOutcome {
  const first = events[0];
  const last = events[events.length - 1];
  const startedAt = optionalTsToMs(first?.eventTime);
  const closedAt = optionalTsToMs(last?.eventTime);
  const closed = (status: RunOutcome['status'], failure?: Failure | null): RunOutcome => ({
    status,
    startedAt,
    closedAt,
    failure: failure ? innermostMessage(failure) : undefined,
  });
  if (last?.workflowExecutionCompletedEventAttributes) return closed('completed');
  if (last?.workflowExecutionFailedEventAttributes)
    return closed('failed', last.workflowExecutionFailedEventAttributes.failure);
  if (last?.workflowExecutionTimedOutEventAttributes) return closed('timed out');
  if (last?.workflowExecutionTerminatedEventAttributes) {
    const reason = last.workflowExecutionTerminatedEventAttributes.reason;
    return { ...closed('terminated'), failure: reason || undefined };
  }
  if (last?.workflowExecutionCanceledEventAttributes) return closed('canceled');
  if (last?.workflowExecutionContinuedAsNewEventAttributes) return closed('continued as new');
  return { status: 'running', startedAt, closedAt: undefined, failure: undefined };
}

function innermostMessage(failure: Failure): string {
  let current = failure;
  while (current.cause) current = current.cause;
  return current.message ?? '(no message)';
}

const State = temporal.api.enums.v1.PendingActivityState;
const PENDING_STATES = new Map<number, PendingStep['state']>([
  [State.PENDING_ACTIVITY_STATE_SCHEDULED, 'scheduled'],
  [State.PENDING_ACTIVITY_STATE_STARTED, 'started'],
  [State.PENDING_ACTIVITY_STATE_CANCEL_REQUESTED, 'cancel requested'],
  [State.PENDING_ACTIVITY_STATE_PAUSED, 'paused'],
  [State.PENDING_ACTIVITY_STATE_PAUSE_REQUESTED, 'pause requested'],
]);

/** The pipeline steps among a run's pending activities (DescribeWorkflowExecution's `pendingActivities`). */
export function pendingSteps(
  pending: readonly temporal.api.workflow.v1.IPendingActivityInfo[] | null | undefined,
): PendingStep[] {
  return (pending ?? []).flatMap((activity): PendingStep[] => {
    const step = stepNames().find((s) => s === activity.activityId);
    if (step === undefined) return [];
    return [
      {
        step,
        attempt: activity.attempt ?? 1,
        state: PENDING_STATES.get(Number(activity.state ?? 0)) ?? 'unknown',
        lastWorker: activity.lastWorkerIdentity || undefined,
        lastFailure: activity.lastFailure ? innermostMessage(activity.lastFailure) : undefined,
      },
    ];
  });
}

/**
 * Marks steps skipped on resume from the history alone, for when there is no session start to pass as `since`
 * (the report command): a step whose completion was recorded before another worker took the run over, and which
 * that worker did not run itself, was replayed from the history by it rather than run again.
 */
export function markSkippedOnResume(report: RecoveryReport, details: RunDetails): RecoveryReport {
  const steps = report.steps.map((step): StepReport => {
    const done = step.status === 'completed' ? step.completedAt : undefined;
    const skipped =
      done !== undefined &&
      !step.doneEarlier &&
      details.takeovers.some((t) => t.at !== undefined && t.at > done && t.to !== step.worker);
    return { ...step, skippedOnResume: skipped };
  });
  return { ...report, steps };
}
