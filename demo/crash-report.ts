import { dataPaths } from '../src/config';
import { SqliteAnswerMemo } from '../src/model/memo-store';
import type { SqlitePublicationStore } from '../src/publisher/publication-store';
import { markSkippedOnResume, recoveryReport, runDetails } from '../src/runs/history';
import type { StepReport } from '../src/runs/history';
import { classifyStep, summarizeReports } from '../src/runs/step-outcome';
import type { Submission } from '../src/runs/submit';
import type { ChatRequest } from './model-server';
import { say } from './say';
import type { WorkerProcess } from './worker-process';

/** Two processes' clocks on one machine: a model call this long after its step's recorded completion is a rerun. */
const CLOCK_TOLERANCE_MS = 500;

/**
 * What the demo shows once every run has finished: a timeline per document (when each step was recorded, by which
 * worker, replayed or rerun and why), the model calls counted at the model server by key, the memo's rows and the
 * publications. False when a finished step ran again, a call fits no step, or a document was published twice.
 */
export async function reportRecovery({
  runs,
  workers,
  killed,
  model,
  store,
  dataDir,
  at,
}: {
  runs: readonly Submission[];
  workers: readonly WorkerProcess[];
  /** Worker 1, the one the crash took. */
  killed: WorkerProcess;
  model: { readonly requests: readonly ChatRequest[] };
  store: SqlitePublicationStore;
  dataDir: string;
  /** A time as the demo shows it, counted from its start. */
  at: (ms?: number) => string;
}): Promise<boolean> {
  let ok = true;
  say('');
  say('Timeline (when each step was recorded as done, counted from the start of the demo):');
  const reports = [];
  const modelSteps: { title: string; step: StepReport }[] = [];
  for (const r of runs) {
    const history = await r.handle.fetchHistory();
    const details = runDetails(history);
    const report = markSkippedOnResume(recoveryReport(history), details);
    reports.push(report);
    say(`  ${r.document.title} (${r.workflowId})`);
    for (const step of report.steps) {
      const how = explain(step, details.publication?.duplicate ?? false, killed, workers);
      if (step.step !== 'publish') modelSteps.push({ title: r.document.title, step });
      const when = step.completedAt === undefined ? '-' : at(step.completedAt);
      const by = processName(step.worker, workers);
      say(`  ${when.padStart(8)}  ${step.step.padEnd(9)}  ${by.padEnd(8)}  ${how}`, ' '.repeat(33));
    }
  }

  const memo = new SqliteAnswerMemo(dataPaths(dataDir).memo);
  try {
    const revisions = (await Promise.all(runs.map((r) => store.revisionsOf(r.document.documentId)))).flat();
    const deliveries = await store.deliveries();
    const duplicates = deliveries.filter((d) => d.outcome === 'duplicate').length;
    const once = revisions.length === runs.length && revisions.every((r) => r.revision === 1);
    say('');
    say(summarizeReports(reports));
    const calls = countModelCalls(model.requests, modelSteps, at);
    say(
      `Model calls, counted at the model server by their idempotency-key header: ${model.requests.length} ` +
        `call(s) under ${calls.keys} distinct key(s), for ${modelSteps.length} model steps.`,
    );
    if (calls.repeated.length === 0) say('  No key was called more than once.');
    else say(`  Called more than once: ${calls.repeated.length} key(s):`);
    for (const line of calls.repeated) say(`    ${line}`, '      ');
    say(
      `${calls.late.length} calls for steps already recorded as done: ` +
        (calls.late.length === 0
          ? 'no key was called after the history recorded its step as completed.'
          : `REPEATED FINISHED STEPS: ${calls.late.join('; ')}`),
    );
    for (const problem of calls.problems) say(`PROBLEM: ${problem}`);
    say(
      `Model answers kept (memo rows): ${await memo.count()} for ${modelSteps.length} model steps; a retry that ` +
        'finds its key there reads the answer back instead of calling the model again.',
    );
    if (calls.late.length > 0 || calls.problems.length > 0) ok = false;
    say(
      `Publications: ${await store.countPublications()} document(s), ${revisions.length} revision(s): ` +
        `${once ? 'one per document, no duplicates' : 'MORE THAN ONE PER DOCUMENT'}. ` +
        `${deliveries.length} deliveries reached the target, ${duplicates} of them a retry answered with the ` +
        'first receipt.',
    );
    if (!once) ok = false;
  } finally {
    await memo.close();
  }
  return ok;
}

/** `<pid>@<host>` identities are shown as the worker's number in this demo (their pids are printed as they start). */
function processName(identity: string | undefined, workers: readonly WorkerProcess[]): string {
  if (identity === undefined) return '-';
  const index = workers.findIndex((w) => w.identity === identity);
  const pid = identity.split('@')[0] ?? identity;
  return index === -1 ? `pid ${pid}` : `worker ${index + 1}`;
}

/**
 * The model server's request log checked against the histories, as the chaos test does: per key, how many calls
 * and why more than one; any call that arrived after its step's completion was recorded (a finished step run
 * again), and calls that do not fit the history at all.
 */
function countModelCalls(
  requests: readonly ChatRequest[],
  modelSteps: readonly { title: string; step: StepReport }[],
  at: (ms?: number) => string,
): { keys: number; repeated: string[]; late: string[]; problems: string[] } {
  const repeated: string[] = [];
  const late: string[] = [];
  const problems: string[] = [];
  const stepKeys = new Set<string>();
  for (const { title, step } of modelSteps) {
    const key = step.idempotencyKey;
    const what = `"${title}" ${step.step}`;
    if (key === undefined || step.status !== 'completed' || step.completedAt === undefined) {
      problems.push(`${what} is ${step.status}, not completed`);
      continue;
    }
    stepKeys.add(key);
    const own = requests.filter((r) => r.idempotencyKey === key);
    const after = own.filter((r) => r.receivedAt > (step.completedAt ?? 0) + CLOCK_TOLERANCE_MS);
    if (after.length > 0)
      late.push(`${what} (${key}): ${after.length} call(s) after ${at(step.completedAt)}`);
    if (own.length === 0) problems.push(`${what} (${key}) never reached the model server`);
    if (own.length > step.attempts)
      problems.push(`${what} (${key}): ${own.length} calls for ${step.attempts} recorded attempt(s)`);
    if (own.length < 2) continue;
    const fates = own.map(
      (r) =>
        `${at(r.receivedAt)} ${r.cutOff ? 'cut off by the kill' : r.answeredAt !== undefined ? 'answered' : 'open'}`,
    );
    const earlier = own.slice(0, -1);
    const why = earlier.every((r) => r.cutOff)
      ? 'the kill cut off the call before its answer came back, so the retry asked again under the same key ' +
        '(expected: no answer had been paid for)'
      : 'an earlier call was answered but its worker died before it wrote the memo, so the answer was bought again';
    repeated.push(`${what}: ${own.length} calls (${fates.join(', ')}): ${why}`);
  }
  const stray = requests.filter((r) => !stepKeys.has(r.idempotencyKey ?? ''));
  if (stray.length > 0)
    problems.push(
      `${stray.length} call(s) under keys no step has: ${[...new Set(stray.map((r) => r.idempotencyKey))].join(', ')}`,
    );
  return { keys: new Set(requests.map((r) => r.idempotencyKey)).size, repeated, late, problems };
}

/** How one step fared, for the timeline. */
function explain(
  step: StepReport,
  duplicatePublish: boolean,
  killed: WorkerProcess,
  workers: readonly WorkerProcess[],
): string {
  const outcome = classifyStep(step);
  if (outcome === 'skipped on resume')
    return 'done before the crash; skipped on resume (replayed from the history)';
  if (outcome === 'memoised')
    return `attempt ${step.attempts}: reused the answer memoised before the crash, no second model call`;
  if (outcome === 'rerun') {
    const lost = `${(step.timeLostMs / 1000).toFixed(1)} s lost`;
    const why = `${step.lastFailure ?? 'no failure recorded'} after ${processName(killed.identity, workers)} died`;
    const receipt =
      step.step === 'publish' && duplicatePublish
        ? '; the target had committed the killed attempt and answered this one with its first receipt'
        : '';
    return `rerun as attempt ${step.attempts} (${why}; ${lost})${receipt}`;
  }
  if (outcome !== 'once') return outcome;
  if (step.worker === killed.identity) return 'ran once, before the crash';
  return 'ran once, after the crash';
}
