import { lostWallTimeMs } from './history';
import type { PendingStep, RecoveryReport, StepReport } from './history';

/**
 * What happened to a step, in one word: the one classification that the result table, the summary line, the
 * report command and the crash demo all word and count from.
 */
export type StepOutcome =
  | 'not started'
  | 'running'
  | 'failed'
  | 'timed out'
  /** Its run had ended before this session: a finished document submitted again, its result read back. */
  | 'done earlier'
  /** Completed before this session (or before a takeover) and replayed from the history, not run again. */
  | 'skipped on resume'
  /** Completed by an attempt that read back the answer an earlier attempt paid for. */
  | 'memoised'
  /** Completed on a later attempt under the same key, after a crash, a timeout or an error. */
  | 'rerun'
  | 'once';

/** Classifies a step from its report. */
export function classifyStep(step: StepReport): StepOutcome {
  if (step.status !== 'completed') return step.status;
  if (step.doneEarlier) return 'done earlier';
  if (step.skippedOnResume) return 'skipped on resume';
  if (step.memoised) return 'memoised';
  if (step.attempts > 1) return 'rerun';
  return 'once';
}

/** How the step fared, in a few words, for the result table. */
export function describeStep(step: StepReport): string {
  const outcome = classifyStep(step);
  switch (outcome) {
    case 'done earlier':
      return 'already done earlier';
    case 'skipped on resume':
      return 'done earlier, skipped on resume';
    case 'memoised':
      return step.bulk !== undefined
        ? 'answered by a provider batch (bulk)'
        : `reused memoised answer (attempt ${step.attempts})`;
    case 'rerun':
      return `rerun, attempt ${step.attempts}`;
    case 'once':
      return 'ran once';
    default:
      return outcome;
  }
}

/** What happened to one step across crashes, in a sentence, for the report command. */
export function stepRecovery(step: StepReport, pending?: PendingStep): string {
  const outcome = classifyStep(step);
  switch (outcome) {
    case 'not started':
      return 'not started yet';
    case 'running':
      return pending
        ? `in progress: attempt ${pending.attempt} ${pending.state}`
        : 'in progress (attempt not yet recorded)';
    case 'failed':
    case 'timed out':
      return `${outcome} after ${step.attempts} attempt(s)`;
    case 'done earlier':
      return 'already done earlier: the run had ended before this session; nothing ran again';
    case 'skipped on resume':
      return 'done before a worker crash or restart; the next worker skipped it on resume (replayed from history)';
    case 'memoised':
      return `reused from the memo: attempt ${step.attempts} read back the answer an earlier attempt paid for, no new model call`;
    case 'rerun':
      return `rerun: completed on attempt ${step.attempts} under the same key`;
    case 'once':
      return 'ran once';
  }
}

/** Steps counted by outcome, and the wall time the reruns lost (overlapping waits counted once). */
export function countOutcomes(reports: readonly RecoveryReport[]): {
  counts: Record<StepOutcome, number>;
  lostMs: number;
} {
  const counts: Record<StepOutcome, number> = {
    'not started': 0,
    running: 0,
    failed: 0,
    'timed out': 0,
    'done earlier': 0,
    'skipped on resume': 0,
    memoised: 0,
    rerun: 0,
    once: 0,
  };
  const retried: StepReport[] = [];
  for (const step of reports.flatMap((r) => r.steps)) {
    const outcome = classifyStep(step);
    counts[outcome] += 1;
    if (outcome === 'rerun' || outcome === 'memoised') retried.push(step);
  }
  return { counts, lostMs: lostWallTimeMs(retried) };
}

/** The one-line recovery summary: how many steps were skipped, rerun, or reused from the memo. */
export function summarizeReports(reports: readonly RecoveryReport[]): string {
  const { counts, lostMs } = countOutcomes(reports);
  const earlier = counts['done earlier'];
  const finished =
    earlier > 0 ? `${earlier} step(s) already done earlier (finished runs, not run again), ` : '';
  return (
    `Recovery: ${finished}${counts['skipped on resume']} step(s) skipped on resume, ${counts.rerun} rerun after a ` +
    `failure (${(lostMs / 1000).toFixed(1)} s of wall time lost), ${counts.memoised} model answer(s) reused from ` +
    'the memo.'
  );
}
