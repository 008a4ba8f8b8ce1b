import path from 'node:path';
import type { Client } from '@temporalio/client';
import { BlobStore } from './blobs';
import { followProgress, submitDocument } from './client';
import type { Submission } from './client';
import type { Config } from './config';
import { dataPaths } from './dependencies';
import { collectDocuments } from './documents';
import { describeStep, recoveryReport, summarizeReports, withDecodedResults } from './report';
import type { RecoveryReport } from './report';
import { formatCost, totalUsage } from './model/pricing';
import type { PipelineResult, SummarizeResult, TagResult } from './shared';

/** The documents a fresh clone processes when no paths are given. */
export const SAMPLES_DIR = path.resolve(__dirname, '..', 'samples');

export interface DocumentOutcome {
  source: string;
  title: string;
  workflowId: string | undefined;
  result: PipelineResult | undefined;
  error: string | undefined;
  report: RecoveryReport | undefined;
}

/**
 * Submits every document found in `paths`, follows the runs to the end and prints one row per document,
 * failed ones with the reason. Nothing is dropped: unreadable inputs are listed as failed too.
 * Returns the outcomes; the caller decides the exit code.
 */
export async function processDocuments(
  client: Client,
  config: Config,
  paths: readonly string[],
  { since = Date.now(), print = console.log }: { since?: number; print?: (line: string) => void } = {},
): Promise<DocumentOutcome[]> {
  const { documents, rejected } = collectDocuments(paths, config.maxDocumentBytes);
  const blobs = new BlobStore(dataPaths(config.dataDir).blobs);
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
      submission = await submitDocument(client, blobs, config.taskQueue, document);
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

function printOutcomes(outcomes: readonly DocumentOutcome[], print: (line: string) => void): void {
  const rows = outcomes.map((o) => {
    const steps = o.report?.steps.map((s) => `${s.step}: ${describeStep(s)}`).join('; ') ?? '-';
    return {
      document: o.title.slice(0, 36),
      status: o.result ? `published r${o.result.publication.revision}` : 'FAILED',
      model: o.result ? `${o.result.summary.model.provider}` : '-',
      cost: o.result ? describeUsage([o.result.summary, o.result.tags]) : '-',
      tags: o.result ? o.result.tags.tags.join(', ').slice(0, 48) : '-',
      steps,
    };
  });
  print('');
  print('Results');
  const headers = {
    document: 'Document',
    status: 'Status',
    model: 'Model',
    cost: 'Tokens in/out, cost',
    tags: 'Tags',
    steps: 'Steps',
  };
  const columns = ['document', 'status', 'model', 'cost', 'tags'] as const;
  const widths = columns.map((c) => Math.max(headers[c].length, ...rows.map((r) => r[c].length)));
  const line = (r: Record<(typeof columns)[number], string>): string =>
    columns.map((c, i) => r[c].padEnd(widths[i] ?? 0)).join('  ');
  print(line(headers));
  print(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const r of rows) {
    print(line(r));
    print(`    ${r.steps}`);
  }
  for (const o of outcomes) {
    if (o.error !== undefined) print(`FAILED ${o.source}: ${o.error}`);
  }
  for (const o of outcomes) {
    if (o.result)
      print(
        `\n${o.title} [${o.result.summary.model.provider}/${o.result.summary.model.model}]\n  ${o.result.summary.summary}`,
      );
  }
  const reports = outcomes.flatMap((o) => (o.report ? [o.report] : []));
  const ok = outcomes.filter((o) => o.result).length;
  print('');
  print(`${ok} of ${outcomes.length} document(s) published, ${outcomes.length - ok} failed.`);
  const steps = outcomes.flatMap((o) => (o.result ? [o.result.summary, o.result.tags] : []));
  print(`Model usage: ${describeUsage(steps)} in total, each answer counted once (memoised ones included).`);
  print(summarizeReports(reports));
}

/** Tokens in/out and estimated cost of some model steps, e.g. `1200/85 tok, $0.000231`. */
export function describeUsage(steps: readonly (SummarizeResult | TagResult)[]): string {
  const total = totalUsage(steps);
  return `${total.inputTokens}/${total.outputTokens} tok, ${formatCost(total.costUsd)}`;
}
