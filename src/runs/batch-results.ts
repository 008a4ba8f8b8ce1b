import type { Client } from '@temporalio/client';
import { describeFailure } from '../contract/batch';
import type { BatchEntry, BatchProgress, BudgetWaitingDocument, HeldDocument } from '../contract/batch';
import { workflowIdFor } from '../contract';
import { formatCost } from '../model/pricing';
import type { ClientCalls } from './calls';
import { withDecodedResults } from './decode-history';
import { recoveryReport } from './history';
import type { RecoveryReport } from './history';
import type { DocumentOutcome } from './result-table';

/** Each document's result and recovery report, read once at the end, a few at a time. */
export async function readOutcomes(
  client: Client,
  calls: ClientCalls,
  entries: readonly BatchEntry[],
  since: number,
  print: (line: string) => void,
  paused: {
    held?: readonly HeldDocument[];
    overBudget?: readonly BudgetWaitingDocument[];
    awaitingReview?: readonly { workflowId: string }[];
    /** Indexes of entries the batch never took up (its window full of paused runs): they have no run yet. */
    notStarted?: ReadonlySet<number>;
  } = {},
): Promise<DocumentOutcome[]> {
  const { held = [], overBudget = [], awaitingReview = [], notStarted = new Set<number>() } = paused;
  const outcomes: DocumentOutcome[] = new Array<DocumentOutcome>(entries.length);
  let nextIndex = 0;
  const readOne = async (entry: BatchEntry, index: number): Promise<DocumentOutcome> => {
    const workflowId = workflowIdFor(entry.documentId);
    const handle = client.workflow.getHandle(workflowId);
    const base = { source: entry.source, title: entry.title, workflowId };
    if (notStarted.has(index))
      return { ...base, result: undefined, error: undefined, report: undefined, notStarted: true };
    let report: RecoveryReport | undefined;
    try {
      const runId = (await calls.run(() => handle.describe())).runId;
      const history = await withDecodedResults(
        await calls.run(() => client.workflow.getHandle(workflowId, runId).fetchHistory()),
        client.options.loadedDataConverter,
      );
      report = recoveryReport(history, since, runId);
    } catch (err) {
      print(`${entry.source}: no recovery report (${describeFailure(err).reason})`);
    }
    // A held run has no result yet, and waiting for one would wait for a person.
    const heldKey = held.find((h) => h.workflowId === workflowId)?.heldKey;
    if (heldKey !== undefined) return { ...base, result: undefined, error: undefined, report, heldKey };
    // So does one waiting for its budget to be raised.
    const budgetId = overBudget.find((b) => b.workflowId === workflowId)?.budgetId;
    if (budgetId !== undefined) return { ...base, result: undefined, error: undefined, report, budgetId };
    // And one whose draft awaits a person's review.
    if (awaitingReview.some((r) => r.workflowId === workflowId))
      return { ...base, result: undefined, error: undefined, report, awaitingReview: true };
    try {
      return { ...base, result: await calls.run(() => handle.result()), error: undefined, report };
    } catch (err) {
      return { ...base, result: undefined, error: describeFailure(err).reason, report };
    }
  };
  const reader = async (): Promise<void> => {
    for (let i = nextIndex++; i < entries.length; i = nextIndex++) {
      const entry = entries[i];
      if (entry !== undefined) outcomes[i] = await readOne(entry, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(8, entries.length) }, reader));
  return outcomes;
}

/** The end of a big batch: what the batch counted, without reading any document's result. */
export function printTally(progress: BatchProgress, rejected: number, print: (line: string) => void): void {
  const { tally, total } = progress;
  print('');
  const superseded =
    tally.superseded > 0 ? ` ${tally.superseded} superseded by a newer run (not written),` : '';
  print(
    `${tally.done - tally.superseded} of ${total + rejected} document(s) published,${superseded} ` +
      `${tally.failed + rejected} failed` +
      (progress.started < total ? `, ${total - progress.started} not yet started.` : '.'),
  );
  const notes = [
    tally.doneEarlier > 0 ? `${tally.doneEarlier} done earlier (not run again; --rerun runs them anew)` : '',
    tally.attached > 0 ? `${tally.attached} already under way (waited on, not rerun)` : '',
    tally.replaced > 0 ? `${tally.replaced} replaced an older version's run` : '',
  ].filter((n) => n !== '');
  if (notes.length > 0) print(`Of those: ${notes.join('; ')}.`);
  const steps = Object.entries(tally.steps)
    .map(([step, n]) => `${step} ${n.done} done${n.failed > 0 ? `, ${n.failed} failed` : ''}`)
    .join('; ');
  print(`Steps: ${steps}.`);
  print(
    `Model usage: ${tally.inputTokens}/${tally.outputTokens} tok, ${formatCost(tally.costUsd)} for the documents ` +
      `that finished; ${tally.memoised} answer(s) reused from the memo.` +
      (tally.failed > 0
        ? " Failed documents' paid steps are not in that sum: the worker's pipeline_model_* metrics count every " +
          'paid call, and a resubmission reuses those answers.'
        : ''),
  );
  if (progress.unlistedFailures > 0) {
    print(
      `${progress.unlistedFailures} more failure(s) are counted but not listed; list them with ` +
        'temporal workflow list --query \'ExecutionStatus="Failed"\'.',
    );
  }
  if (progress.runs > 1)
    print(`The batch continued as new ${progress.runs - 1} time(s) to keep its history short.`);
}
