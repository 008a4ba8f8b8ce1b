import type { Client } from '@temporalio/client';
import { batch } from '../workflow/batch';
import { BATCH_SCHEMA_VERSION, batchIdFor } from '../contract/batch';
import type { BatchInput, BatchTally } from '../contract/batch';
import { BULK_PROVIDERS } from '../bulk/types';
import { ConfigError } from '../config';
import type { Config } from '../config';
import type { ModelInfo } from '../contract';
import type { BlobStore } from '../documents/blobs';
import { followBatch } from './batch-follow';
import { failureLine } from './batch-progress';
import { printTally, readOutcomes } from './batch-results';
import { storeDocuments } from './batch-upload';
import { ClientCalls } from './calls';
import {
  budgetLines,
  bulkLines,
  exitCodeOf,
  failedOutcome,
  heldLines,
  printOutcomes,
  reviewLines,
} from './result-table';
import type { ReviewSettings } from '../contract/review';
import { describeBudget, raiseCommand, raiseCommandOf } from '../model/pacing-status';
import type { SqlRateLimits } from '../model/rate-limit-store';
import type { DocumentOutcome } from './result-table';

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
  /** What the batch's model calls may spend together; its budget is named after the batch. */
  budget?: { usd?: number; tokens?: number };
  /** Every document's draft waits for a person's review before it is published (REVIEW=on). */
  review?: ReviewSettings;
  /** Bulk mode (`--bulk`, BULK=on): the model requests go to the provider's batch API first (docs/bulk.md). */
  bulk?: boolean;
  /** The fleet's pacing of provider calls and the budgets: progress says when a provider is limiting the batch. */
  pacing?: SqlRateLimits;
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

/** Bulk mode needs a provider with a batch API: says so before anything is submitted. */
function checkBulkModel(model: ModelInfo): void {
  if (BULK_PROVIDERS.includes(model.provider)) return;
  throw new ConfigError(
    `bulk mode (--bulk, BULK=on) sends the model requests to a provider's batch API, and the model is ` +
      `${model.provider}/${model.model}: set MODEL=openai:<model> or MODEL=anthropic:<model>, or leave bulk mode off`,
  );
}

/** How a batch ended: the listed outcomes (every document of a small batch; the failures of a big one). */
export interface BatchReport {
  batchId: string | undefined;
  outcomes: DocumentOutcome[];
  /** The batch's own count of what ended, undefined when nothing was submitted. */
  tally: BatchTally | undefined;
  /**
   * exitCodeOf's: 1 when a document failed; else 4 when a delivery is held for a verdict; else 5 when a document
   * waits for its budget; else 3 when a publication was superseded by a newer run; else 0.
   */
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
  const batchId = batchIdFor(manifestRef, rerun ? Date.now() : undefined);
  const budget = options.budget === undefined ? undefined : { id: batchId, ...options.budget };
  const review = options.review ?? config.review;
  const bulk = (options.bulk ?? false) || config.bulkOn ? config.bulk : undefined;
  if (bulk !== undefined && options.configuredModel !== undefined) checkBulkModel(options.configuredModel);
  const input: BatchInput = {
    schemaVersion: BATCH_SCHEMA_VERSION,
    manifestRef,
    total,
    options: {
      window,
      rerun,
      pipeline: { stepBudgetMinutes: config.stepBudgetMinutes },
      ...(options.historyBudget !== undefined ? { historyBudget: options.historyBudget } : {}),
      ...(budget === undefined ? {} : { budget }),
      ...(review === undefined ? {} : { review }),
      ...(config.agent === undefined ? {} : { agent: config.agent }),
      ...(bulk === undefined ? {} : { bulk }),
    },
  };
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
  // The command that raises the batch's budget names the limits it has: a dollar figure for a budget of tokens
  // would add a limit and leave the one that binds where it is.
  let raise: (budgetId: string) => string = raiseCommandOf;
  if (budget !== undefined) {
    const limits = { limitTokens: budget.tokens ?? null, limitUsd: budget.usd ?? null };
    raise = (id) => raiseCommand({ id, ...limits, spentTokens: 0, spentUsd: 0 });
  }
  if (budget !== undefined && options.pacing !== undefined) {
    // A budget is set once, by the batch's first call: a resubmission with other figures does not change it.
    const set = await options.pacing.budget(budget.id).catch(() => undefined);
    if (set !== undefined) raise = (id) => raiseCommand({ ...set, id });
    const differs =
      set !== undefined &&
      ((budget.usd !== undefined && set.limitUsd !== budget.usd) ||
        (budget.tokens !== undefined && set.limitTokens !== budget.tokens));
    if (differs)
      print(
        `${describeBudget(set)}; it was set when the batch first ran: raise it with ${raise(budget.id)}.`,
      );
  }
  const { progress: final, pausedOnly } = await followBatch(client, calls, handle, total, config.taskQueue, {
    print,
    raise,
    ...(options.stream !== undefined ? { stream: options.stream } : {}),
    everyMs: options.everyMs ?? 1_000,
    perDocument: listed,
    resumedBefore: resumed ? attachedAt : undefined,
    ...(options.pacing === undefined ? {} : { pacing: options.pacing, limits: config.modelLimits }),
  });

  // Ended with only paused documents under way (deliveries held for a verdict, steps waiting for their budget):
  // their runs go on, and finish once the verdict is given or the budget raised.
  const held = pausedOnly ? (final.held ?? []) : [];
  const overBudget = pausedOnly ? (final.waitingForBudget ?? []) : [];
  const awaitingReview = pausedOnly ? (final.awaitingReview ?? []) : [];
  // The window was full of paused runs: the documents after them were never taken up, and wait behind them.
  const notStarted = new Set(
    pausedOnly
      ? (listed ?? []).map((_, i) => i).filter((i) => !final.handled.some((h) => h.index === i))
      : [],
  );
  const outcomes = listed
    ? [
        ...rejected,
        ...(await readOutcomes(client, calls, listed, since, print, {
          held,
          overBudget,
          awaitingReview,
          notStarted,
        })),
      ]
    : [...rejected, ...final.failures.map((f) => failedOutcome(f.source, f.workflowId, f.reason))];
  // Stopped while reading the results: their errors say only that.
  signal?.throwIfAborted();
  if (listed)
    printOutcomes(
      outcomes,
      print,
      options.configuredModel ? { configuredModel: options.configuredModel, raise } : { raise },
    );
  else {
    printTally(final, rejected.length, print);
    for (const line of heldLines(held)) print(line);
    for (const line of budgetLines(overBudget, raise)) print(line);
    for (const line of reviewLines(awaitingReview)) print(line);
  }
  for (const line of bulkLines(final.bulk)) print(line);
  // Spent against the budget, from the store every worker settles its calls in.
  if (budget !== undefined && options.pacing !== undefined) {
    const status = await options.pacing.budget(budget.id).catch(() => undefined);
    if (status !== undefined) print(describeBudget(status));
  }
  const failed = final.tally.failed + rejected.length;
  return {
    batchId,
    outcomes,
    tally: final.tally,
    exitCode: exitCodeOf(
      failed,
      final.tally.superseded,
      held.length,
      overBudget.length,
      awaitingReview.length,
    ),
  };
}
