import { setTimeout as sleep } from 'node:timers/promises';
import { WorkflowFailedError } from '@temporalio/client';
import type { Client, WorkflowHandle } from '@temporalio/client';
import { batch } from '../workflow/batch';
import { batchProgressQuery, progressQuery } from '../workflow/queries';
import { describeFailure, OPEN_LISTED } from '../contract/batch';
import { describePacing } from '../model/pacing-status';
import type { LimitSettings } from '../model/rate-limit';
import type { SqlRateLimits } from '../model/rate-limit-store';
import type { BatchEntry, BatchProgress } from '../contract/batch';
import { workflowIdFor } from '../contract';
import { BatchProgressDisplay } from './batch-progress';
import type { ProgressOutput } from './batch-progress';
import type { ClientCalls } from './calls';
import { cut, titleWidth } from './columns';
import { describeProgress } from './submit';

/** How a small batch's line says a document was taken up. */
const HANDLED: Record<BatchProgress['handled'][number]['how'], string> = {
  started: 'started',
  replaced: 'replacing the run of the previous version',
  'done earlier': 'already done earlier',
  attached: 'resuming the run already under way',
};

/**
 * Follows the batch to its end with one progress query per round (never one per document): the bar, each
 * failure once, and for small batches each open document's step states. Says so when no worker is polling.
 * The end is seen by describing the batch each round (a long poll for its result would hold a call open for
 * as long as the batch runs); stopped by the signal, it makes no call more and throws the signal's reason.
 */
export async function followBatch(
  client: Client,
  calls: ClientCalls,
  handle: WorkflowHandle<typeof batch>,
  total: number,
  taskQueue: string,
  options: ProgressOutput & {
    everyMs: number;
    perDocument: readonly BatchEntry[] | undefined;
    /** When this client attached to a batch under way: what it had taken up before was taken up earlier. */
    resumedBefore: number | undefined;
    /** The fleet's pacing of provider calls, to say when a provider is limiting the batch; and the set limits. */
    pacing?: SqlRateLimits;
    limits?: LimitSettings;
  },
): Promise<{ progress: BatchProgress; pausedOnly: boolean }> {
  const display = new BatchProgressDisplay(total, options);
  const pacing =
    options.pacing === undefined ? undefined : new PacingWatch(options.pacing, options.limits ?? {});
  let final: BatchProgress | undefined;
  // Rounds in a row in which every document under way was paused (its delivery held for a verdict, or waiting for
  // its budget): two end the follow (one could be a moment before the batch starts the next document).
  let heldRounds = 0;
  let heldEnd: BatchProgress | undefined;
  let failure: unknown;
  const shown = new Map<string, string>();
  const titles = new Map(options.perDocument?.map((e) => [workflowIdFor(e.documentId), e.title]));
  let handledShown = 0;
  const showHandled = (progress: BatchProgress): void => {
    for (const { index, workflowId, how, at } of progress.handled.slice(handledShown)) {
      const earlier = options.resumedBefore !== undefined && at < options.resumedBefore;
      const note = earlier && (how === 'started' || how === 'replaced') ? HANDLED.attached : HANDLED[how];
      display.log(`${options.perDocument?.[index]?.source ?? workflowId} -> ${workflowId} (${note})`);
    }
    handledShown = Math.max(handledShown, progress.handled.length);
  };
  const watchdog = new WorkerWatchdog(client, calls, taskQueue, (line) => display.log(line));
  const { stopped } = calls;
  try {
    while (final === undefined && failure === undefined && heldEnd === undefined && !calls.isStopped) {
      // While no worker answers, the watchdog looks at the task queue.
      const asked = calls
        .run(() => handle.query(batchProgressQuery, display.seenFailures))
        .then(
          (progress) => progress,
          () => undefined,
        );
      const answer = (): Promise<BatchProgress | undefined | 'slow'> =>
        Promise.race([asked, stopped.then(() => undefined), sleep(3_000).then(() => 'slow' as const)]);
      let progress = await answer();
      while (progress === 'slow') {
        await watchdog.check();
        progress = await answer();
      }
      if (progress !== undefined) {
        display.update(progress);
        watchdog.answered();
        const held =
          (progress.held?.length ?? 0) +
          (progress.waitingForBudget?.length ?? 0) +
          (progress.awaitingReview?.length ?? 0);
        heldRounds = held > 0 && progress.running === held ? heldRounds + 1 : 0;
        if (heldRounds >= 2) heldEnd = progress;
        if (options.perDocument !== undefined) {
          showHandled(progress);
          await showDocuments(client, calls, progress.open, titles, shown, (l) => display.log(l));
        }
      }
      if (pacing !== undefined) for (const line of await pacing.lines()) display.log(line);
      if (heldEnd !== undefined) break;
      const ended = await batchEnd(client, calls, handle.workflowId);
      if (ended !== undefined) ({ final, failure } = ended);
      else await Promise.race([stopped, sleep(options.everyMs)]);
    }
  } finally {
    display.stop();
  }
  // Stopped by the signal, not failed: the batch carries on without this client.
  calls.throwIfStopped();
  if (heldEnd !== undefined) return { progress: heldEnd, pausedOnly: true };
  if (failure !== undefined)
    throw new Error(`batch ${handle.workflowId} failed: ${describeFailure(failure).reason}`);
  if (final === undefined) throw new Error(`batch ${handle.workflowId} ended without a result`);
  if (options.perDocument !== undefined) showHandled(final);
  display.update(final);
  return { progress: final, pausedOnly: false };
}

/**
 * The batch's end, once its latest run has closed (a run that continued as new is followed by the next): its
 * result, or how it failed. Undefined while it runs, or when Temporal could not say this round.
 */
async function batchEnd(
  client: Client,
  calls: ClientCalls,
  workflowId: string,
): Promise<{ final?: BatchProgress; failure?: unknown } | undefined> {
  let latest;
  try {
    latest = await calls.run(() => client.workflow.getHandle(workflowId).describe());
  } catch {
    return undefined;
  }
  if (latest.status.name === 'RUNNING' || latest.status.name === 'CONTINUED_AS_NEW') return undefined;
  const run = client.workflow.getHandle<typeof batch>(workflowId, latest.runId, { followRuns: false });
  try {
    return { final: await calls.run(() => run.result()) };
  } catch (err) {
    // The run failed, was terminated or timed out; any other error is Temporal not answering this round.
    return err instanceof WorkflowFailedError ? { failure: err } : undefined;
  }
}

/** Each open document's step states, printed when they change: `  <title>  summarize ✓  tag …  publish ·`. */
async function showDocuments(
  client: Client,
  calls: ClientCalls,
  open: readonly string[],
  titles: Map<string, string>,
  shown: Map<string, string>,
  print: (line: string) => void,
): Promise<void> {
  // The step states take 36 columns: `summarize ✓  tag ✓  publish ✓`, and the indent.
  const width = titleWidth(40);
  await Promise.all(
    open.slice(0, OPEN_LISTED).map(async (workflowId) => {
      try {
        const handle = client.workflow.getHandle(workflowId);
        const line = describeProgress(await calls.run(() => handle.query(progressQuery)));
        if (shown.get(workflowId) === line) return;
        shown.set(workflowId, line);
        print(`  ${cut(titles.get(workflowId) ?? workflowId, width).padEnd(width)} ${line}`);
      } catch {
        // Not started yet, or just ended: the next round or the table tells.
      }
    }),
  );
}

/** How often a batch's progress says how a limiting provider paces it. */
const PACING_EVERY_MS = 10_000;

/**
 * Says when a provider is limiting the batch: a line every PACING_EVERY_MS while calls wait their turn or the
 * provider refuses some (calls in the last minute against the limit, refusals so far, calls waiting), read from
 * the store every worker paces its calls in.
 */
class PacingWatch {
  private lastAt = 0;
  private readonly refusalsSeen = new Map<string, number>();

  constructor(
    private readonly limits: SqlRateLimits,
    private readonly settings: LimitSettings,
  ) {}

  async lines(): Promise<string[]> {
    if (Date.now() - this.lastAt < PACING_EVERY_MS) return [];
    this.lastAt = Date.now();
    try {
      const lines: string[] = [];
      for (const scope of await this.limits.scopes()) {
        const status = await this.limits.status(scope, this.settings);
        if (status === undefined) continue;
        const refused = status.refusals + status.overloads;
        const newRefusals = refused > (this.refusalsSeen.get(scope) ?? refused);
        if (!this.refusalsSeen.has(scope) || newRefusals) this.refusalsSeen.set(scope, refused);
        if (status.waiting > 0 || newRefusals) lines.push(`Limited: ${describePacing(status)}`);
      }
      return lines;
    } catch {
      // The store is out this round: the next one tells.
      return [];
    }
  }
}

/**
 * Notices a batch nobody works on: when its progress goes unanswered and the task queue has no poller, says how
 * to start a worker, once; and says when one turns up.
 */
class WorkerWatchdog {
  private warned = false;

  constructor(
    private readonly client: Client,
    private readonly calls: ClientCalls,
    private readonly taskQueue: string,
    private readonly print: (line: string) => void,
  ) {}

  answered(): void {
    if (this.warned) this.print(`A worker is polling task queue "${this.taskQueue}": carrying on.`);
    this.warned = false;
  }

  async check(): Promise<void> {
    if (this.warned) return;
    let pollers: number;
    try {
      const { client, taskQueue } = this;
      const described = await this.calls.run(() =>
        client.workflowService.describeTaskQueue({
          namespace: client.options.namespace,
          taskQueue: { name: taskQueue },
        }),
      );
      pollers = described.pollers?.length ?? 0;
    } catch {
      return;
    }
    if (pollers > 0) return;
    this.warned = true;
    this.print(
      `No worker is polling task queue "${this.taskQueue}": start one with npm run worker ` +
        '(the batch waits, nothing is lost).',
    );
  }
}
