import { modelStepResults } from '../contract';
import type { ModelStepFields } from '../contract';
import { formatCost, totalUsage } from '../model/pricing';
import type { PipelineResult } from '../contract';
import type { RecoveryReport } from './history';
import { describeStep, summarizeReports } from './step-outcome';

/** One document's line in the table: its result, or why it failed, and its recovery report. */
export interface DocumentOutcome {
  source: string;
  title: string;
  workflowId: string | undefined;
  result: PipelineResult | undefined;
  error: string | undefined;
  report: RecoveryReport | undefined;
}

/**
 * The result table `npm start` and `npm run pipeline` end with: one row per document (status, model, tokens and
 * cost, tags) with how each step fared, the failures with their reasons, each summary, and the totals.
 */
export function printOutcomes(outcomes: readonly DocumentOutcome[], print: (line: string) => void): void {
  const rows = outcomes.map((o) => {
    const steps = o.report?.steps.map((s) => `${s.step}: ${describeStep(s)}`).join('; ') ?? '-';
    return {
      document: o.title.slice(0, 36),
      status: o.result ? `published r${o.result.publication.revision}` : 'FAILED',
      model: o.result ? `${o.result.summary.model.provider}` : '-',
      cost: o.result ? describeUsage(modelStepResults(o.result)) : '-',
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
  const steps = outcomes.flatMap((o) => (o.result ? modelStepResults(o.result) : []));
  print(`Model usage: ${describeUsage(steps)} in total, each answer counted once (memoised ones included).`);
  print(summarizeReports(reports));
}

/** Tokens in/out and estimated cost of some model steps, e.g. `1200/85 tok, $0.000231`. */
export function describeUsage(steps: readonly ModelStepFields[]): string {
  const total = totalUsage(steps);
  return `${total.inputTokens}/${total.outputTokens} tok, ${formatCost(total.costUsd)}`;
}
