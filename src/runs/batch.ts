import { createHash } from 'node:crypto';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { WorkflowFailedError } from '@temporalio/client';
import type { Client, WorkflowHandle } from '@temporalio/client';
import { batch, batchProgressQuery, progressQuery } from '../../workflows';
import { BATCH_SCHEMA_VERSION, batchIdFor, describeFailure, OPEN_LISTED } from '../batch-contract';
import type { BatchEntry, BatchInput, BatchProgress, BatchTally, HeldDocument } from '../batch-contract';
import type { Config } from '../config';
import { workflowIdFor } from '../contract';
import type { ModelInfo } from '../contract';
import type { BlobStore } from '../documents/blobs';
import { eachDocument, versionOf } from '../documents/files';
import { formatCost } from '../model/pricing';
import { BatchProgressDisplay, failureLine } from './batch-progress';
import { ClientCalls } from './calls';
import { cut, titleWidth } from './columns';
import { ManifestWriter } from '../documents/manifest';
import type { ProgressOutput } from './batch-progress';
import { withDecodedResults } from './decode-history';
import { recoveryReport } from './history';
import type { RecoveryReport } from './history';
import { exitCodeOf, heldLines, printOutcomes } from './result-table';
import type { DocumentOutcome } from './result-table';
import { describeProgress } from './submit';

export type { DocumentOutcome };

/** Up to this many documents a batch ends with the full table and per-document step lines; above, a summary. */
export const TABLE_LIMIT = 20;

export interface ProcessOptions {
  /** Start of this session: steps completed before it were done earlier (the recovery report says so). */
  since?: number;
  print?: (line: string) => void;
  /** Where the progress bar goes when it is a terminal (npm start and npm run pipeline pass stdout). */
  stream?: NodeJS.WriteStream;
  /** Process documents again as new runs, even those whose version completed before. */
  rerun?: boolean;
  /** Document runs open at once (BATCH_WINDOW). */
  window?: number;
  /** Texts stored at once while uploading. */
  uploadConcurrency?: number;
  /** How often the batch's progress is asked for. */
  everyMs?: number;
  /** The model the workers are configured with: the table points out results another model made earlier. */
  configuredModel?: ModelInfo;
  /** Tests: the batch's history budget, to see it continue as new on a small batch. */
  historyBudget?: number;
  /** Tests: entries per manifest page (MANIFEST_PAGE_SIZE), to see a small batch stored in pages. */
  manifestPageSize?: number;
  /**
   * Stops following the batch (the batch itself carries on): the calls to Temporal under way are cancelled, no
   * other is made, and the returned promise rejects with the signal's reason. Whichever way it ends, it settles
   * only once no call it made is out (retries included), so its caller may close the connection next.
   */
  signal?: AbortSignal;
}

/** How a batch ended: the listed outcomes (every document of a small batch; the failures of a big one). */
export interface BatchReport {
  batchId: string | undefined;
  outcomes: DocumentOutcome[];
  /** The batch's own count of what ended, undefined when nothing was submitted. */
  tally: BatchTally | undefined;
  /** 1 when a document failed, 3 when none failed but a publication was superseded, else 0. */
  exitCode: number;
}

/**
 * Runs every document found in `paths` as one batch workflow: stores each text (a few at a time, each let go
 * once stored), stores the list of references as the batch's manifest, starts (or attaches to) the batch, and
 * follows it with one progress query a second. Nothing is dropped: unreadable inputs are listed as failed.
 * Small batches end with the full table, read once per document; big ones with the batch's own summary.
 */
export async function processDocuments(
  client: Client,
  config: Config,
  blobs: BlobStore,
  paths: readonly string[],
  options: ProcessOptions = {},
): Promise<BatchReport> {
  options.signal?.throwIfAborted();
  const calls = new ClientCalls(client, options.signal);
  try {
    return await runBatch(client, calls, config, blobs, paths, options);
  } finally {
    // No call outlives this function, whichever way it ends: its caller may close the connection next.
    await calls.drained();
  }
}

async function runBatch(
  client: Client,
  calls: ClientCalls,
  config: Config,
  blobs: BlobStore,
  paths: readonly string[],
  options: ProcessOptions,
): Promise<BatchReport> {
  const { since = Date.now(), print = console.log, rerun = false, signal } = options;
  const { manifestRef, total, entries, rejected } = await storeDocuments(config, blobs, paths, {
    concurrency: options.uploadConcurrency ?? 8,
    pageSize: options.manifestPageSize,
    signal,
  });
  // A small batch lists its documents as they are taken up and in its table at the end; a big one lists its
  // failures, the rejected files now.
  const listed = total <= TABLE_LIMIT ? entries : undefined;
  if (listed === undefined)
    for (const r of rejected) print(failureLine({ source: r.source, reason: r.error ?? 'rejected' }));
  if (manifestRef === undefined) {
    printOutcomes(rejected, print);
    return {
      batchId: undefined,
      outcomes: rejected,
      tally: undefined,
      exitCode: exitCodeOf(rejected.length, 0),
    };
  }

  const window = options.window ?? config.batchWindow;
  const input: BatchInput = {
    schemaVersion: BATCH_SCHEMA_VERSION,
    manifestRef,
    total,
    options: {
      window,
      rerun,
      pipeline: { stepBudgetMinutes: config.stepBudgetMinutes },
      ...(options.historyBudget !== undefined ? { historyBudget: options.historyBudget } : {}),
    },
  };
  const batchId = batchIdFor(manifestRef, rerun ? Date.now() : undefined);
  const attachedAt = Date.now();
  const handle = await calls.run(() =>
    client.workflow.start(batch, {
      taskQueue: config.taskQueue,
      workflowId: batchId,
      args: [input],
      // The same documents submitted again attach to the batch under way; a finished batch runs again, and its
      // documents that completed are counted as done earlier, not rerun.
      workflowIdConflictPolicy: 'USE_EXISTING',
      workflowIdReusePolicy: 'ALLOW_DUPLICATE',
    }),
  );
  // The batch under way since before this session (an earlier npm start killed mid-batch, another client)?
  const startedAt = (await calls.run(() => handle.describe())).startTime.getTime();
  const resumed = startedAt < attachedAt - 1_000;
  print(
    `Batch ${batchId}: ${total} document(s), ${window} at a time` +
      `${rerun ? ', processed again as new runs (--rerun)' : ''}` +
      `${resumed ? `; resuming it (under way since ${new Date(startedAt).toISOString()})` : ''}.`,
  );
  const { progress: final, heldOnly } = await followBatch(client, calls, handle, total, config.taskQueue, {
    print,
    ...(options.stream !== undefined ? { stream: options.stream } : {}),
    everyMs: options.everyMs ?? 1_000,
    perDocument: listed,
    resumedBefore: resumed ? attachedAt : undefined,
  });

  // Ended with only held documents under way: their runs go on, and finish once their deliveries are settled.
  const held = heldOnly ? (final.held ?? []) : [];
  const outcomes = listed
    ? [...rejected, ...(await readOutcomes(client, calls, listed, since, print, held))]
    : [...rejected, ...final.failures.map((f) => failedOutcome(f.source, f.workflowId, f.reason))];
  // Stopped while reading the results: their errors say only that.
  signal?.throwIfAborted();
  if (listed)
    printOutcomes(
      outcomes,
      print,
      options.configuredModel ? { configuredModel: options.configuredModel } : {},
    );
  else {
    printTally(final, rejected.length, print);
    for (const line of heldLines(held)) print(line);
  }
  const failed = final.tally.failed + rejected.length;
  return {
    batchId,
    outcomes,
    tally: final.tally,
    exitCode: exitCodeOf(failed, final.tally.superseded, held.length),
  };
}

/**
 * Reads and stores each document, a few stores in flight at a time, and lets its bytes go once stored; then its
 * entry goes into the manifest page under way, and each full page is stored and let go. What the client holds
 * does not grow with the batch: one page of entries, the pages' references (one per MANIFEST_PAGE_SIZE
 * documents), and a short digest per document to know the same version of a document named twice (one entry).
 * `entries` are the batch's, when it fits in one page.
 */
async function storeDocuments(
  config: Config,
  blobs: BlobStore,
  paths: readonly string[],
  options: { concurrency: number; pageSize: number | undefined; signal: AbortSignal | undefined },
): Promise<{
  manifestRef: string | undefined;
  total: number;
  entries: BatchEntry[] | undefined;
  rejected: DocumentOutcome[];
}> {
  const { concurrency, pageSize, signal } = options;
  const manifest = new ManifestWriter(blobs, pageSize);
  const rejected: DocumentOutcome[] = [];
  const seen = new Set<string>();
  const inFlight = new Set<Promise<void>>();
  let failure: unknown;
  const folders = { idSecret: config.documentIdSecret, extensions: config.documentExtensions };
  for (const item of eachDocument(paths, config.maxDocumentBytes, folders)) {
    if ('rejected' in item) {
      rejected.push(failedOutcome(item.rejected.source, undefined, item.rejected.reason));
      continue;
    }
    const { document } = item;
    const textRef = versionOf(document.bytes);
    const key = createHash('sha256')
      .update(`${document.documentId} ${textRef}`)
      .digest('base64url')
      .slice(0, 22);
    if (seen.has(key)) continue;
    seen.add(key);
    const stored: Promise<void> = blobs.put(document.bytes).then(
      () => void inFlight.delete(stored),
      (err: unknown) => {
        failure ??= err;
        inFlight.delete(stored);
      },
    );
    inFlight.add(stored);
    await manifest.add({
      documentId: document.documentId,
      textRef,
      title: document.title,
      source: document.source,
    });
    if (inFlight.size >= concurrency) await Promise.race(inFlight);
    if (failure !== undefined || signal?.aborted === true) break;
  }
  await Promise.all(inFlight);
  if (failure !== undefined) throw failure;
  signal?.throwIfAborted();
  return { ...(await manifest.finish()), total: manifest.total, rejected };
}

function failedOutcome(source: string, workflowId: string | undefined, error: string): DocumentOutcome {
  return { source, title: path.basename(source), workflowId, result: undefined, error, report: undefined };
}

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
async function followBatch(
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
  },
): Promise<{ progress: BatchProgress; heldOnly: boolean }> {
  const display = new BatchProgressDisplay(total, options);
  let final: BatchProgress | undefined;
  // Rounds in a row in which every document under way was held: two end the follow (one could be a moment
  // before the batch starts the next document).
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
        const held = progress.held?.length ?? 0;
        heldRounds = held > 0 && progress.running === held ? heldRounds + 1 : 0;
        if (heldRounds >= 2) heldEnd = progress;
        if (options.perDocument !== undefined) {
          showHandled(progress);
          await showDocuments(client, calls, progress.open, titles, shown, (l) => display.log(l));
        }
      }
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
  if (heldEnd !== undefined) return { progress: heldEnd, heldOnly: true };
  if (failure !== undefined)
    throw new Error(`batch ${handle.workflowId} failed: ${describeFailure(failure).reason}`);
  if (final === undefined) throw new Error(`batch ${handle.workflowId} ended without a result`);
  if (options.perDocument !== undefined) showHandled(final);
  display.update(final);
  return { progress: final, heldOnly: false };
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

/** Each document's result and recovery report, read once at the end, a few at a time. */
async function readOutcomes(
  client: Client,
  calls: ClientCalls,
  entries: readonly BatchEntry[],
  since: number,
  print: (line: string) => void,
  held: readonly HeldDocument[] = [],
): Promise<DocumentOutcome[]> {
  const outcomes: DocumentOutcome[] = new Array<DocumentOutcome>(entries.length);
  let nextIndex = 0;
  const readOne = async (entry: BatchEntry): Promise<DocumentOutcome> => {
    const workflowId = workflowIdFor(entry.documentId);
    const handle = client.workflow.getHandle(workflowId);
    const base = { source: entry.source, title: entry.title, workflowId };
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
    try {
      return { ...base, result: await calls.run(() => handle.result()), error: undefined, report };
    } catch (err) {
      return { ...base, result: undefined, error: describeFailure(err).reason, report };
    }
  };
  const reader = async (): Promise<void> => {
    for (let i = nextIndex++; i < entries.length; i = nextIndex++) {
      const entry = entries[i];
      if (entry !== undefined) outcomes[i] = await readOne(entry);
    }
  };
  await Promise.all(Array.from({ length: Math.min(8, entries.length) }, reader));
  return outcomes;
}

/** The end of a big batch: what the batch counted, without reading any document's result. */
function printTally(progress: BatchProgress, rejected: number, print: (line: string) => void): void {
  const { tally, total } = progress;
  print('');
  const superseded =
    tally.superseded > 0 ? ` ${tally.superseded} superseded by a newer run (not written),` : '';
  print(
    `${tally.done - tally.superseded} of ${total + rejected} document(s) published,${superseded} ` +
      `${tally.failed + rejected} failed.`,
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
