import path from 'node:path';
import { modelName } from '../steps/define';
import type { AnyModelStep } from '../steps/define';
import { registeredModelSteps } from '../steps/registry';
import { isModelStepFields, modelStepResults, stepNameOfKey } from '../contract';
import type { ModelInfo, ModelStepFields } from '../contract';
import type { BulkProgress } from '../contract/batch-plain';
import { raiseCommandOf } from '../model/pacing-status';
import { formatCost, formatTokens, totalUsage } from '../model/pricing';
import type { PipelineResult } from '../contract';
import type { RecoveryReport } from './history';
import { cut, terminalWidth, titleWidth } from './columns';
import { agentLines } from './agent-lines';
import { describeStep, summarizeReports } from './step-outcome';
import { describeOutcome } from '../contract/review';

/** One document's line in the table: its result, or why it failed, and its recovery report. */
export interface DocumentOutcome {
  source: string;
  title: string;
  workflowId: string | undefined;
  result: PipelineResult | undefined;
  error: string | undefined;
  report: RecoveryReport | undefined;
  /** Its run waits for a verdict on its delivery under this key (npm run deliveries): not ended, not failed. */
  heldKey?: string;
  /** Its run waits for this budget to be raised (npm run budget): not ended, not failed. */
  budgetId?: string;
  /** Its run's draft awaits a person's review (npm run review): not ended, not failed. */
  awaitingReview?: true;
  /** The batch has not taken it up yet: its window is full of paused runs (held, waiting for budget). */
  notStarted?: true;
}

/** The outcome of a document that failed before or without a result: a rejected file, a failure the batch listed. */
export function failedOutcome(
  source: string,
  workflowId: string | undefined,
  error: string,
): DocumentOutcome {
  return { source, title: path.basename(source), workflowId, result: undefined, error, report: undefined };
}

/**
 * How a document ended: published, superseded (a newer run of it had published first), failed, or held (its
 * delivery may have landed unanswered; its run goes on once a person or the receiver's lookup says).
 */
export type DocumentStatus =
  'published' | 'superseded' | 'rejected' | 'failed' | 'held' | 'budget' | 'review' | 'not started';

/** The exit code of a batch that ended with deliveries held for a verdict, and nothing failed. */
export const HELD_EXIT_CODE = 4;
/** The exit code of a batch that ended with documents waiting for their budget, and nothing failed or held. */
export const BUDGET_EXIT_CODE = 5;
/** The exit code of a batch that ended with drafts awaiting review, and nothing failed, held or over budget. */
export const REVIEW_EXIT_CODE = 6;

/** The status of one document. A superseded publication was answered, not written: it is never "published". */
export function documentStatus(outcome: DocumentOutcome): DocumentStatus {
  if (outcome.heldKey !== undefined) return 'held';
  if (outcome.budgetId !== undefined) return 'budget';
  if (outcome.awaitingReview === true) return 'review';
  if (outcome.notStarted === true) return 'not started';
  if (outcome.result === undefined) return 'failed';
  const { publication } = outcome.result;
  if (publication === undefined) return 'rejected';
  return publication.superseded === true ? 'superseded' : 'published';
}

/**
 * The exit code of a batch: 1 when a document failed; 4 when none failed but deliveries are held for a verdict
 * (their runs end once it is given); 5 when none failed or is held but documents wait for their budget (`npm run
 * budget -- raise` wakes them); 3 when a publication was superseded by a newer run of its document (nothing to
 * retry, but this batch's text is not what the target holds); else 0.
 */
export function exitCodeFor(outcomes: readonly DocumentOutcome[]): number {
  const statuses = outcomes.map(documentStatus);
  return exitCodeOf(
    statuses.filter((s) => s === 'failed').length,
    statuses.filter((s) => s === 'superseded').length,
    statuses.filter((s) => s === 'held').length,
    statuses.filter((s) => s === 'budget').length,
    statuses.filter((s) => s === 'review').length,
  );
}

/** exitCodeFor from counts, for a batch that counted its documents rather than listing them. */
export function exitCodeOf(
  failed: number,
  superseded: number,
  held = 0,
  overBudget = 0,
  awaitingReview = 0,
): number {
  if (failed > 0) return 1;
  if (held > 0) return HELD_EXIT_CODE;
  if (overBudget > 0) return BUDGET_EXIT_CODE;
  if (awaitingReview > 0) return REVIEW_EXIT_CODE;
  return superseded > 0 ? 3 : 0;
}

/** The lines that say which documents wait for their budget and how to raise it. */
export function budgetLines(
  waiting: readonly { source: string; budgetId: string }[],
  raise: (budgetId: string) => string = raiseCommandOf,
): string[] {
  if (waiting.length === 0) return [];
  const budgets = [...new Set(waiting.map((w) => w.budgetId))];
  return [
    `${waiting.length} document(s) wait for their budget: their next model call would pass it, and nothing is ` +
      'paid past a budget. Raise it and their runs go on by themselves (npm run budget shows what is spent):',
    ...budgets.map((id) => `BUDGET ${id}: ${raise(id)}`),
    ...waiting.map((w) => `WAITING FOR BUDGET ${w.source} (budget ${w.budgetId})`),
  ];
}

/** The lines that say which drafts await review and how to give it. */
export function reviewLines(awaiting: readonly { source: string }[]): string[] {
  if (awaiting.length === 0) return [];
  return [
    `${awaiting.length} document(s) await review: nothing of theirs is published until a person approves or ` +
      'edits the draft. Their runs finish by themselves once reviewed:',
    'REVIEW npm run review   (lists the drafts; then npm run review -- approve <document>, or edit, or reject)',
    '       with a server and a worker up (npm start stopped its own: npm run server, then npm run worker)',
    ...awaiting.map((a) => `AWAITING REVIEW ${a.source}`),
  ];
}

/** The lines that say which deliveries wait for a verdict and how to give it. */
export function heldLines(held: readonly { source: string; heldKey: string }[]): string[] {
  if (held.length === 0) return [];
  return [
    `${held.length} delivery(ies) held: each may have reached the receiver without an answer, and sending it ` +
      'again could publish twice. Check the receiver for each key, then settle it; its run finishes by itself:',
    ...held.map(
      (h) =>
        `HELD ${h.source}: npm run deliveries -- resolve ${h.heldKey} delivered --revision N   (or ... unsent)`,
    ),
  ];
}

/** The status column: `published r2`, `SUPERSEDED by r3`, `FAILED`. */
function statusCell(outcome: DocumentOutcome): string {
  const revision = outcome.result?.publication?.revision;
  const review = outcome.result?.review;
  const reviewed =
    review === undefined
      ? ''
      : review.reviewer === undefined
        ? `, ${review.outcome}`
        : `, ${review.outcome} by ${review.reviewer}`;
  switch (documentStatus(outcome)) {
    case 'published':
      return `published r${revision}${reviewed}${producedEarlier(outcome) ? ', earlier' : ''}`;
    case 'rejected':
      return review?.outcome === 'expired'
        ? 'REJECTED: review expired'
        : `REJECTED${reviewed.replace(/^, rejected/, '')}`;
    case 'review':
      return 'WAITING: review';
    case 'superseded':
      return `SUPERSEDED by r${revision}`;
    case 'failed':
      return 'FAILED';
    case 'held':
      return 'HELD';
    case 'budget':
      return 'WAITING: budget';
    case 'not started':
      return 'NOT STARTED';
  }
}

/**
 * The result table `npm start` and `npm run pipeline` end with: one row per document (status, model, tokens and
 * cost, tags) with how each step fared, the failures with their reasons, each summary, and the totals.
 */
/** True when every step of the document's run had finished before this session: nothing ran now. */
function producedEarlier(outcome: DocumentOutcome): boolean {
  const steps = outcome.report?.steps ?? [];
  return steps.length > 0 && steps.every((s) => s.doneEarlier);
}

export function printOutcomes(
  outcomes: readonly DocumentOutcome[],
  print: (line: string) => void,
  {
    columns = terminalWidth(),
    configuredModel,
    raise,
  }: {
    columns?: number;
    /** The model this session's workers are configured with: results made earlier by another are pointed out. */
    configuredModel?: ModelInfo;
    /** The command that raises a budget, naming its limits (the batch knows its own). */
    raise?: ((budgetId: string) => string) | undefined;
  } = {},
): void {
  // The steps' own columns (each definition's `column`), in step order; the last gives way to the terminal's width.
  const stepColumns = registeredModelSteps().flatMap((step) =>
    step.column === undefined ? [] : [{ step, header: step.column.header }],
  );
  const rows = outcomes.map((o) => {
    const steps = o.report?.steps.map((s) => `${s.step}: ${describeStep(s)}`).join('; ') ?? '-';
    const cells = stepColumns.map(({ step }) => {
      const result = o.result === undefined ? undefined : resultOf(o.result, step);
      return result === undefined ? '-' : (step.column?.cell(result) ?? '-');
    });
    return {
      fixed: [o.title, statusCell(o), describeUsage(paidSteps(o)), ...cells],
      steps: cut(steps, columns - 4),
    };
  });
  print('');
  print('Results');
  const headers = ['Document', 'Status', 'Tokens in/out, cost', ...stepColumns.map((c) => c.header)];
  const last = headers.length - 1;
  // The title and the last column give way to the terminal's width (a title is cut here, once); the middle ones
  // are short, cut at 28 characters.
  for (const r of rows) for (let c = 3; c < last; c++) r.fixed[c] = cut(r.fixed[c] ?? '', 28);
  const widthOf = (c: number): number =>
    Math.max(headers[c]?.length ?? 0, ...rows.map((r) => r.fixed[c]?.length ?? 0)) + 2;
  let fixed = 0;
  for (let c = 1; c < last; c++) fixed += widthOf(c);
  const titleRoom = titleWidth(fixed + 26, columns);
  for (const r of rows) r.fixed[0] = cut(r.fixed[0] ?? '', titleRoom);
  const used = fixed + widthOf(0);
  for (const r of rows) r.fixed[last] = cut(r.fixed[last] ?? '', Math.max(16, columns - used));
  const widths = headers.map((_, c) => widthOf(c) - 2);
  const line = (cells: readonly string[]): string =>
    cells
      .map((cell, c) => cell.padEnd(widths[c] ?? 0))
      .join('  ')
      .trimEnd();
  print(line(headers));
  print(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const r of rows) {
    print(line(r.fixed));
    print(`    ${r.steps}`);
  }
  for (const o of outcomes) {
    if (o.error !== undefined) print(`FAILED ${o.source}: ${o.error}`);
    const review = o.result?.review;
    if (review !== undefined && documentStatus(o) === 'rejected')
      print(`REJECTED ${o.source}: ${describeOutcome(review)}`);
    if (review?.edits !== undefined)
      print(`EDITED ${o.source}: ${Object.keys(review.edits).join(', ')} by ${review.reviewer ?? 'unknown'}`);
  }
  for (const o of outcomes) {
    const { result } = o;
    if (result === undefined) continue;
    for (const step of registeredModelSteps()) {
      const stepResult = resultOf(result, step);
      const detail = stepResult === undefined ? undefined : step.column?.detail?.(stepResult);
      if (detail !== undefined) print(`\n${o.title} ${detail}`);
    }
    for (const line of agentLines(result)) print(`${o.title} ${line}`);
  }
  const reports = outcomes.flatMap((o) => (o.report ? [o.report] : []));
  const count = (status: DocumentStatus): number =>
    outcomes.filter((o) => documentStatus(o) === status).length;
  print('');
  const superseded =
    count('superseded') > 0 ? ` ${count('superseded')} superseded by a newer run (not written),` : '';
  const held = count('held') > 0 ? ` ${count('held')} held for a verdict on their delivery,` : '';
  const waiting = count('budget') > 0 ? ` ${count('budget')} waiting for their budget,` : '';
  const reviewing = count('review') > 0 ? ` ${count('review')} awaiting review,` : '';
  const rejected = count('rejected') > 0 ? ` ${count('rejected')} rejected in review (not published),` : '';
  const behind =
    count('not started') > 0
      ? ` ${count('not started')} not started yet (behind the paused ones: they start once those go on),`
      : '';
  print(
    `${count('published')} of ${outcomes.length} document(s) published,${superseded}${rejected}${held}${waiting}${reviewing}${behind} ${count('failed')} failed.`,
  );
  for (const line of heldLines(
    outcomes.flatMap((o) => (o.heldKey !== undefined ? [{ source: o.source, heldKey: o.heldKey }] : [])),
  ))
    print(line);
  for (const line of budgetLines(
    outcomes.flatMap((o) => (o.budgetId !== undefined ? [{ source: o.source, budgetId: o.budgetId }] : [])),
    raise,
  ))
    print(line);
  for (const line of reviewLines(outcomes.filter((o) => o.awaitingReview === true))) print(line);
  for (const o of outcomes) {
    if (documentStatus(o) === 'superseded')
      print(
        `SUPERSEDED ${o.source}: a newer run had already published revision ${o.result?.publication?.revision}`,
      );
  }
  const webhook = outcomes.flatMap((o) =>
    o.result?.publication?.target === 'webhook' ? [o.result.publication.receiverHonoursKey === true] : [],
  );
  if (webhook.length > 0) {
    print(
      webhook.some(Boolean)
        ? 'Webhook receiver: echoes Idempotency-Key, so it dedupes; a delivery whose answer was lost is sent again.'
        : 'Webhook receiver: does not echo Idempotency-Key; a delivery whose answer was lost is held for ' +
            '`npm run deliveries` instead of being sent twice.',
    );
  }
  const steps = outcomes.flatMap(paidSteps);
  const failedPaid = count('failed') > 0 ? ", failed documents' paid steps included" : '';
  print(
    `Model usage: ${describeUsage(steps)} in total${failedPaid}, each answer counted once (memoised ones ` +
      'included).',
  );
  print(summarizeReports(reports));
  for (const line of changeLines(outcomes)) print(line);
  const earlier = outcomes.filter(producedEarlier);
  if (earlier.length > 0) {
    print(
      `${earlier.length} result(s) were produced earlier, not in this session ("earlier" in the table, with the ` +
        'model that made them); npm start -- --rerun processes documents again as new runs.',
    );
  }
  const wanted = configuredModel === undefined ? undefined : modelName(configuredModel);
  const other = new Set(
    earlier
      .flatMap((o) =>
        modelStepResults(o.result ?? {})
          .slice(0, 1)
          .map((r) => modelName(r.model)),
      )
      .filter((m) => m !== wanted),
  );
  if (wanted !== undefined && other.size > 0) {
    print(
      `Those were made by ${[...other].join(', ')}, and the workers are now configured with ${wanted}: ` +
        'add --rerun to process them with it.',
    );
  }
}

/** A step's result within a run's result (under its key); undefined when the run has none for it. */
function resultOf(result: PipelineResult, step: AnyModelStep): ModelStepFields | undefined {
  const found: unknown = (result as Record<string, unknown>)[step.resultKey];
  return isModelStepFields(found) ? found : undefined;
}

/**
 * The model steps a document paid for: its result's, or, for a failed document, those its history recorded as
 * done (a document that failed at tag has paid for its summary).
 */
function paidSteps(outcome: DocumentOutcome): UsageOfStep[] {
  if (outcome.result !== undefined) return modelStepResults(outcome.result);
  return (outcome.report?.steps ?? []).flatMap((s) =>
    s.status === 'completed' && s.usage !== undefined
      ? [{ usage: s.usage, rejectedUsage: s.rejectedUsage, estimatedCostUsd: s.estimatedCostUsd ?? null }]
      : [],
  );
}

type UsageOfStep = Pick<ModelStepFields, 'usage' | 'rejectedUsage' | 'estimatedCostUsd'>;

/** Tokens in/out and estimated cost of some model steps, e.g. `1200/85 tok, $0.000231`, `1200 (900 cached)/85 tok, …`. */
export function describeUsage(steps: readonly UsageOfStep[]): string {
  const total = totalUsage(steps);
  return `${formatTokens(total)}, ${formatCost(total.costUsd)}`;
}

/**
 * What bulk mode's provider batches came to, after the table: each batch and its state, what the answers cost at
 * the batch price, and what the same answers would have cost one call each. None without bulk mode.
 */
export function bulkLines(bulk: BulkProgress | undefined): string[] {
  if (bulk === undefined) return [];
  const { totals } = bulk;
  const batches = bulk.batches.map(
    (b) => `${b.providerBatchId} ${b.status} (round ${b.round}: ${b.succeeded} of ${b.total} answered)`,
  );
  const left = [
    totals.refused > 0 ? `${totals.refused} refused (paid, sent again)` : '',
    totals.errored > 0 ? `${totals.errored} errored` : '',
    totals.expired > 0 ? `${totals.expired} expired` : '',
    totals.canceled > 0 ? `${totals.canceled} cancelled` : '',
  ].filter((n) => n !== '');
  const saved =
    totals.costUsd !== null && totals.listCostUsd !== null
      ? ` (saved ${formatCost(totals.listCostUsd - totals.costUsd)})`
      : '';
  return [
    `Bulk: ${bulk.batches.length} provider batch(es)${batches.length > 0 ? `: ${batches.join('; ')}` : ''}` +
      `${bulk.phase === 'cancelled' ? ', cancelled' : ''}.`,
    `Bulk: ${totals.answered} answer(s) bought at the batch price, ${formatCost(totals.costUsd)}; one by one they ` +
      `would have cost ${formatCost(totals.listCostUsd)}${saved}.` +
      (left.length > 0
        ? ` Not answered by a batch: ${left.join(', ')}; the documents' own steps call for what is still missing.`
        : '') +
      (bulk.answeredBefore > 0
        ? ` ${bulk.answeredBefore} answer(s) were in the memo already, not sent.`
        : ''),
    ...(bulk.cut === undefined
      ? []
      : [
          `Bulk: ${bulk.cut.requests} request(s) of ${bulk.cut.documents} document(s) not sent in a provider batch: ` +
            `budget ${bulk.cut.budgetId} had too little left for their worst case. The documents' own steps ask ` +
            `for them within the budget, and wait where it would be passed (npm run budget).`,
        ]),
  ];
}

/**
 * What changed since the documents' previous runs: the steps asked again because their definition changed (their
 * identity differs from the one their memoised answer was given under), and how many publications differ from
 * their previous revision. Nothing when no step changed.
 */
export function changeLines(outcomes: readonly DocumentOutcome[]): string[] {
  const askedAgain = new Map<string, number>();
  for (const o of outcomes)
    for (const answer of modelStepResults(o.result ?? {}))
      if (answer.changedFrom !== undefined) {
        const step = stepNameOfKey(answer.idempotencyKey);
        askedAgain.set(step, (askedAgain.get(step) ?? 0) + 1);
      }
  if (askedAgain.size === 0) return [];
  const steps = [...askedAgain].map(([step, n]) => `${step} for ${n} document(s)`).join(', ');
  const compared = outcomes.flatMap((o) => {
    const changed = o.result?.publication?.changed;
    return changed === undefined ? [] : [changed];
  });
  const differ =
    compared.length === 0
      ? ''
      : ` ${compared.filter(Boolean).length} of ${compared.length} publication(s) differ from their previous revision.`;
  return [
    `Asked again because the step changed: ${steps}; the other steps' answers came from the memo, and the ` +
      `earlier answers stay in it (reverting the change reuses them).${differ}`,
  ];
}
