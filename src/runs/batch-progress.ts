import { MultiBar, Presets } from 'cli-progress';
import type { BatchFailure, BatchProgress, BulkProgress } from '../contract/batch';
import { raiseCommandOf } from '../model/pacing-status';

/** Where progress goes: a stream that may be a terminal, and the line printer everything else uses. */
export interface ProgressOutput {
  print: (line: string) => void;
  /** The bar is drawn only when this is a terminal; otherwise a plain line every tenth of the batch. */
  stream?: NodeJS.WriteStream;
  /** The command that raises a budget, naming the limit it has (tokens, dollars): the batch knows its own. */
  raise?: ((budgetId: string) => string) | undefined;
}

/** One failure, one line: `FAILED <source>: <step>: <reason>`. */
export function failureLine(failure: Pick<BatchFailure, 'source' | 'step' | 'reason'>): string {
  return `FAILED ${failure.source}: ${failure.step !== undefined ? `${failure.step}: ` : ''}${failure.reason}`;
}

/**
 * The batch's progress as one bar (a terminal) or a few plain lines (a pipe, a log file), with rate and ETA,
 * and one line per failure as the batch reports it. Each failure is printed once (by its seq).
 */
export class BatchProgressDisplay {
  private readonly multibar: MultiBar | undefined;
  private readonly bar: ReturnType<MultiBar['create']> | undefined;
  private readonly startedAt = Date.now();
  private lastSeq = 0;
  private lastTenth = -1;
  private readonly heldShown = new Map<string, string>();
  private readonly budgetShown = new Map<string, string>();
  private bulkShown = '';

  constructor(
    private readonly total: number,
    private readonly output: ProgressOutput,
  ) {
    if (output.stream?.isTTY === true) {
      this.multibar = new MultiBar(
        {
          stream: output.stream,
          format: ' {bar} {value}/{total} documents | {rate} docs/s | ETA {eta_formatted} | {failed} failed',
          hideCursor: true,
          clearOnComplete: false,
          etaBuffer: 50,
          fps: 5,
        },
        Presets.shades_classic,
      );
      this.bar = this.multibar.create(total, 0, { rate: '0.0', failed: 0 });
    }
  }

  /** The seq of the last failure printed: ask the batch only for failures after it. */
  get seenFailures(): number {
    return this.lastSeq;
  }

  /** Prints a line above the bar (or plainly without one). */
  log(line: string): void {
    if (this.multibar !== undefined) this.multibar.log(`${line}\n`);
    else this.output.print(line);
  }

  update(progress: BatchProgress): void {
    for (const failure of progress.failures) {
      if (failure.seq <= this.lastSeq) continue;
      this.lastSeq = failure.seq;
      this.log(failureLine(failure));
    }
    // A held delivery is said once, as it starts to wait: it is no failure, and it is not running either.
    for (const h of progress.held ?? []) {
      if (this.heldShown.get(h.workflowId) === h.heldKey) continue;
      this.heldShown.set(h.workflowId, h.heldKey);
      this.log(
        `HELD ${h.source}: its delivery ${h.heldKey} may have reached the receiver unanswered; settle it with ` +
          'npm run deliveries (the run waits, then finishes)',
      );
    }
    // So is a step waiting for its budget to be raised.
    for (const b of progress.waitingForBudget ?? []) {
      if (this.budgetShown.get(b.workflowId) === b.budgetId) continue;
      this.budgetShown.set(b.workflowId, b.budgetId);
      this.log(
        `WAITING FOR BUDGET ${b.source}: its next model call would pass budget ${b.budgetId}; raise it with ` +
          `${(this.output.raise ?? raiseCommandOf)(b.budgetId)} (the run waits, then finishes)`,
      );
    }
    // Bulk mode's provider batches: a line each time their state changes.
    const bulk = bulkLine(progress.bulk);
    if (bulk !== undefined && bulk.key !== this.bulkShown) {
      this.bulkShown = bulk.key;
      this.log(bulk.line);
    }
    const ended = progress.tally.done + progress.tally.failed;
    const seconds = (Date.now() - this.startedAt) / 1000;
    const rate = seconds > 0 ? ended / seconds : 0;
    if (this.bar !== undefined) {
      this.bar.update(ended, { rate: rate.toFixed(1), failed: progress.tally.failed });
      return;
    }
    const tenth = this.total === 0 ? 10 : Math.floor((ended * 10) / this.total);
    if (tenth === this.lastTenth || ended === 0) return;
    this.lastTenth = tenth;
    const eta = rate > 0 && ended < this.total ? ` ETA ${Math.ceil((this.total - ended) / rate)} s,` : '';
    this.output.print(
      `progress: ${ended}/${this.total} documents ended (${progress.tally.failed} failed), ` +
        `${rate.toFixed(1)} docs/s,${eta} ${progress.running} running` +
        `${(progress.held?.length ?? 0) > 0 ? ` (${progress.held?.length} of them held)` : ''}`,
    );
  }

  stop(): void {
    this.multibar?.stop();
  }
}

/** Bulk mode's state in a line (the key leaves out the next look's time, so a line is printed on a change only). */
export function bulkLine(bulk: BulkProgress | undefined): { key: string; line: string } | undefined {
  if (bulk === undefined) return undefined;
  const batches = bulk.batches
    .filter((b) => b.round === bulk.round)
    .map(
      (b) =>
        `${b.providerBatchId} ${b.status}, ${b.succeeded} of ${b.total} answered${b.errored > 0 ? `, ${b.errored} not` : ''}`,
    );
  const cut =
    bulk.cut?.round === bulk.round
      ? `; ${bulk.cut.requests} request(s) held back: budget ${bulk.cut.budgetId} has too little left`
      : '';
  const key = `${bulk.phase} ${bulk.round} ${batches.join('; ')}${cut}`;
  const next =
    bulk.nextPollAt === undefined ? '' : `; next look at ${new Date(bulk.nextPollAt).toISOString()}`;
  return {
    key,
    line: `BULK ${bulk.phase}, round ${bulk.round}${batches.length > 0 ? `: ${batches.join('; ')}` : ''}${cut}${next}`,
  };
}
