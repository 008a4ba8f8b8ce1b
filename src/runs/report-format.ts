import type { Usage } from '../contract';
import { describeOutcome } from '../contract/review';
import type { ReviewOutcome } from '../contract/review';
import { formatCost, totalUsage } from '../model/pricing';
import type { PendingStep, RecoveryReport, RunDetails } from './history';
import { stepRecovery } from './step-outcome';

/** The report command's output: the run's outcome, its workers, then each step's recovery story. */
export function formatReport(
  workflowId: string,
  report: RecoveryReport,
  details: RunDetails,
  pending: readonly PendingStep[] = [],
  review?: ReviewOutcome,
): string[] {
  const time = (ms: number | undefined): string => (ms === undefined ? '?' : new Date(ms).toISOString());
  const seconds = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;
  const { outcome } = details;
  const lines = [`Workflow ${workflowId}, run ${report.runId ?? '?'}`];
  const took =
    outcome.closedAt !== undefined && outcome.startedAt !== undefined
      ? `, ${seconds(outcome.closedAt - outcome.startedAt)} after it started`
      : '';
  const receipt = describeReceipt(details.publication);
  lines.push(
    outcome.status === 'running'
      ? `Outcome: running (started ${time(outcome.startedAt)})`
      : `Outcome: ${outcome.status} at ${time(outcome.closedAt)}${took}${receipt}`,
  );
  if (outcome.failure !== undefined) lines.push(`  failure: ${outcome.failure}`);
  lines.push(`Workers that touched the run: ${details.identities.join(', ') || '(none yet)'}`);
  for (const t of details.takeovers) {
    lines.push(
      t.lost
        ? `Resumed: at ${time(t.at)} ${t.to} took over from ${t.from}, which had gone (a task of it timed out), and replayed the history`
        : `Handed over: at ${time(t.at)} ${t.to} went on from ${t.from} (nothing of it timed out: a clean stop, not a crash), replaying the history`,
    );
  }
  for (const step of report.steps) {
    const open = pending.find((p) => p.step === step.step);
    lines.push('');
    if (step.step === 'publish' && review?.outcome === 'rejected' && step.attempts === 0) {
      lines.push(`publish: not run: the review rejected the draft (${describeOutcome(review)})`);
      continue;
    }
    lines.push(`${step.step}: ${step.status}; ${stepRecovery(step, open)}`);
    const attempts = open ? `${open.attempt} (in progress)` : String(step.attempts);
    lines.push(`  attempts:     ${attempts}`);
    const worker = step.worker ?? open?.lastWorker;
    lines.push(
      `  worker:       ${worker ?? '-'}${step.worker ? ' (ran the recorded attempt)' : open?.lastWorker ? ' (last attempt)' : ''}`,
    );
    lines.push(`  key:          ${step.idempotencyKey ?? '-'}`);
    lines.push(
      `  time lost:    ${step.attempts > 1 ? `${seconds(step.timeLostMs)} between scheduling and the recorded attempt` : 'none'}`,
    );
    lines.push(`  last failure: ${step.lastFailure ?? open?.lastFailure ?? 'none'}`);
    if (step.identity !== undefined)
      lines.push(
        `  identity:     ${step.identity}${
          step.changedFrom !== undefined
            ? ` (asked again: the step changed since its earlier answer, made under ${step.changedFrom})`
            : ''
        }`,
      );
    if (step.changed !== undefined)
      lines.push(`  publication:  ${step.changed ? 'differs from' : 'the same as'} the previous revision`);
    if (step.usage !== undefined) {
      lines.push(
        `  model usage:  ${step.usage.inputTokens} tokens in${cachedNote(step.usage)}, ${step.usage.outputTokens} out, ` +
          `${formatCost(step.estimatedCostUsd)}${
            step.bulk !== undefined
              ? ` at the batch price (provider batch ${step.bulk.claim}; one by one ${formatCost(step.bulk.listCostUsd)})`
              : step.memoised
                ? ' (paid once, by the attempt that got the answer)'
                : ''
          }`,
      );
    }
  }
  const priced = report.steps.flatMap(({ usage, estimatedCostUsd }) =>
    usage !== undefined ? [{ usage, estimatedCostUsd }] : [],
  );
  if (priced.length > 0) {
    const total = totalUsage(priced);
    // What the same answers cost one call each: a bulk step's list cost, the others' own.
    const oneByOne = totalUsage(
      report.steps.flatMap(({ usage, estimatedCostUsd, bulk }) =>
        usage !== undefined
          ? [{ usage, estimatedCostUsd: bulk === undefined ? estimatedCostUsd : bulk.listCostUsd }]
          : [],
      ),
    );
    const bulk = report.steps.some((s) => s.bulk !== undefined)
      ? `; one by one the same answers would have cost ${formatCost(oneByOne.costUsd)}`
      : '';
    lines.push('');
    lines.push(
      `Model usage of the run: ${total.inputTokens} tokens in${cachedNote(total)}, ${total.outputTokens} out, ` +
        `${formatCost(total.costUsd)} (each step's answer counted once)${bulk}`,
    );
  }
  return lines;
}

/** What the publish step's receipt says, after the run's outcome. A superseded publication is not "published". */
function describeReceipt(publication: RunDetails['publication']): string {
  if (publication === undefined) return '';
  if (publication.superseded === true)
    return `; SUPERSEDED: a newer run had already published revision ${publication.revision}, this run's publication was not written`;
  const retry = publication.duplicate ? ' (a retry, answered with the first receipt)' : '';
  return `; published as revision ${publication.revision}${retry}`;
}

/** ` (900 from the prompt cache)` when the provider served some input from its cache, else nothing. */
function cachedNote(usage: Usage): string {
  const cached = usage.cachedInputTokens ?? 0;
  return cached > 0 ? ` (${cached} from the prompt cache)` : '';
}
