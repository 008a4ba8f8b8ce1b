import path from 'node:path';
import type { Client } from '@temporalio/client';
import type { BlobStore } from '../documents/blobs';
import { followProgress, submitDocument } from './submit';
import type { Submission } from './submit';
import type { Config } from '../config';
import { collectDocuments } from '../documents/files';
import { recoveryReport } from './history';
import { withDecodedResults } from './decode-history';
import { printOutcomes } from './result-table';
import type { DocumentOutcome } from './result-table';

export type { DocumentOutcome };
import type { RecoveryReport } from './history';

/**
 * Submits every document found in `paths`, follows the runs to the end and prints one row per document,
 * failed ones with the reason. Nothing is dropped: unreadable inputs are listed as failed too.
 * Returns the outcomes; the caller decides the exit code.
 */
export async function processDocuments(
  client: Client,
  config: Config,
  blobs: BlobStore,
  paths: readonly string[],
  { since = Date.now(), print = console.log }: { since?: number; print?: (line: string) => void } = {},
): Promise<DocumentOutcome[]> {
  const { documents, rejected } = collectDocuments(paths, config.maxDocumentBytes, {
    idSecret: config.documentIdSecret,
  });
  const outcomes: DocumentOutcome[] = rejected.map((r) => ({
    source: r.source,
    title: path.basename(r.source),
    workflowId: undefined,
    result: undefined,
    error: r.reason,
    report: undefined,
  }));

  const submissions: Submission[] = [];
  for (const document of documents) {
    let submission: Submission;
    try {
      submission = await submitDocument(client, blobs, config.taskQueue, document, {
        stepBudgetMinutes: config.stepBudgetMinutes,
      });
    } catch (err) {
      // One document the server would not take (say, a bad task queue name) must not sink the others.
      const error = `could not be submitted: ${rootMessage(err)}`;
      outcomes.push({
        source: document.source,
        title: document.title,
        workflowId: undefined,
        result: undefined,
        error,
        report: undefined,
      });
      print(`${document.source}: ${error}`);
      continue;
    }
    submissions.push(submission);
    const note = {
      new: 'started',
      running: 'resuming the run already under way',
      completed: 'already done earlier',
      replaced: 'replacing the run of the previous version',
    }[submission.attachedTo];
    print(`${document.source} -> ${submission.workflowId} (${note})`);
  }
  await followProgress(submissions, print);

  for (const s of submissions) {
    const base = { source: s.document.source, title: s.document.title, workflowId: s.workflowId };
    let report: RecoveryReport | undefined;
    try {
      const history = await withDecodedResults(
        await s.handle.fetchHistory(),
        client.options.loadedDataConverter,
      );
      report = recoveryReport(history, since, (await s.handle.describe()).runId);
    } catch (err) {
      print(`${s.document.source}: no recovery report (${rootMessage(err)})`);
    }
    try {
      outcomes.push({ ...base, result: await s.handle.result(), error: undefined, report });
    } catch (err) {
      outcomes.push({ ...base, result: undefined, error: rootMessage(err), report });
    }
  }
  printOutcomes(outcomes, print);
  return outcomes;
}

/** The innermost message of a failure chain (WorkflowFailedError -> ActivityFailure -> ApplicationFailure). */
export function rootMessage(err: unknown): string {
  let current: unknown = err;
  while (current instanceof Error && current.cause instanceof Error) current = current.cause;
  return current instanceof Error ? current.message : String(current);
}
