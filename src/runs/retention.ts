/**
 * Retention: what open runs still need, and the sweep of everything else older than a cutoff (model memo
 * entries, settled delivery-ledger rows, document blobs). `npm run sweep` is the command line over it.
 */
import type { Client, WorkflowExecutionInfo } from '@temporalio/client';
import { decodeFromPayloadsAtIndex } from '@temporalio/common/lib/internal-non-workflow';
import { DOCUMENT_WORKFLOW } from '../contract';
import { batch } from '../workflow/batch';
import { TextRefSchema } from '../contract';
import type { BlobStore } from '../documents/blobs';
import type { Stores } from '../store/open';
import { runMemo } from './latest-run';
import { manifestBlobRefs } from '../documents/manifest';

/**
 * The runs the sweep must spare: every pipeline run and every batch the server still calls Running. A batch
 * needs its manifest, and the texts of the documents it has not started yet, which no pipeline run names. A
 * batch run that continued as new lately is listed too: the server lists the next run a moment after it closes
 * the last, and a sweep in between must not take the batch for ended.
 */
export function openRunsQuery(now = new Date()): string {
  const lately = new Date(now.getTime() - CONTINUED_LATELY_MS).toISOString();
  return (
    `((WorkflowType = '${DOCUMENT_WORKFLOW}' OR WorkflowType = '${batch.name}') ` +
    `AND ExecutionStatus = 'Running') OR (WorkflowType = '${batch.name}' ` +
    `AND ExecutionStatus = 'ContinuedAsNew' AND CloseTime > '${lately}')`
  );
}
const CONTINUED_LATELY_MS = 10 * 60_000;

/** What the open runs still need: their workflow IDs (memo and ledger rows) and the blobs they read. */
export interface OpenRuns {
  workflowIds: ReadonlySet<string>;
  blobRefs: ReadonlySet<string>;
}

/**
 * Lists the open pipeline runs and batches through the server's visibility store and collects what they
 * reference. Throws when the server cannot answer or an input cannot be decoded (a missing decryption key): the
 * sweep must then remove nothing, since it cannot tell what is still needed.
 */
export async function findOpenRuns(client: Client, blobs: BlobStore): Promise<OpenRuns> {
  const workflowIds = new Set<string>();
  const blobRefs = new Set<string>();
  // A batch's runs (the open one, and those that continued as new lately) share its manifest: read it once.
  const manifestsRead = new Set<string>();
  for await (const run of client.workflow.list({ query: openRunsQuery() })) {
    workflowIds.add(run.workflowId);
    if (run.type === batch.name) {
      for (const ref of blobRefsIn(await runInput(client, run))) {
        if (manifestsRead.has(ref)) continue;
        manifestsRead.add(ref);
        for (const needed of await manifestBlobRefs(blobs, ref)) blobRefs.add(needed);
      }
      continue;
    }
    // submitDocument records the version (the text's blob reference) in the run's memo; runs started without it
    // (older submitters, other clients) are read from the input at the start of their history.
    const { version } = runMemo(run.memo);
    const refs = version !== undefined ? [version] : blobRefsIn(await runInput(client, run));
    for (const ref of refs) blobRefs.add(ref);
  }
  return { workflowIds, blobRefs };
}

/** The run's input, read from its first history event and decoded (decrypted) as the workers decode it. */
async function runInput(client: Client, run: WorkflowExecutionInfo): Promise<unknown> {
  // One event is enough: the input sits in the first, so there is no need to page through the whole history.
  const { history } = await client.workflowService.getWorkflowExecutionHistory({
    namespace: client.options.namespace,
    execution: { workflowId: run.workflowId, runId: run.runId },
    maximumPageSize: 1,
  });
  const started = history?.events?.[0]?.workflowExecutionStartedEventAttributes;
  if (!started) throw new Error(`the history of ${run.workflowId} (run ${run.runId}) has no start event`);
  try {
    return await decodeFromPayloadsAtIndex<unknown>(
      client.options.loadedDataConverter,
      0,
      started.input?.payloads,
    );
  } catch (err) {
    throw new Error(
      `cannot read the input of ${run.workflowId} (run ${run.runId}): ` +
        `${err instanceof Error ? err.message : String(err)}; if payloads are encrypted, give this command the ` +
        'PAYLOAD_ENCRYPTION_KEY (and PAYLOAD_DECRYPTION_KEYS) the workers have',
      { cause: err },
    );
  }
}

/**
 * Every blob reference anywhere in a run's input: today its textRef, but an input of another schema version
 * (waiting for a worker that understands it) keeps its blobs too rather than losing them to a field name.
 */
function blobRefsIn(value: unknown): string[] {
  if (typeof value === 'string') return TextRefSchema.safeParse(value).success ? [value] : [];
  if (typeof value !== 'object' || value === null) return [];
  return Object.values(value).flatMap(blobRefsIn);
}

/** How many of each kind a sweep removed. */
export interface SweepCounts {
  memo: number;
  ledger: number;
  blobs: number;
}

/**
 * Removes memo entries and settled ledger rows last touched before `before` whose workflow is not open, and
 * blobs stored before `before` that no open run reads. Open ledger claims always stay (a delivery whose fate
 * nobody knows is an operator's to reconcile), and so does anything younger than `before`, which covers a run
 * started after `open` was listed.
 */
export async function sweepUnreferenced(
  stores: Pick<Stores, 'memo' | 'ledger' | 'blobs'>,
  open: OpenRuns,
  before: Date,
): Promise<SweepCounts> {
  return {
    memo: await stores.memo.sweep(before, open.workflowIds),
    ledger: await stores.ledger.sweep(before, open.workflowIds),
    blobs: await stores.blobs.sweep(before, open.blobRefs),
  };
}

const DURATION_PATTERN = /^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$/;
const UNIT_MS = [86_400_000, 3_600_000, 60_000, 1_000];
const LONGEST_MS = 36_500 * 86_400_000;

/** The accepted spelling of a retention period, for messages. */
export const DURATION_FORM =
  'whole days, hours, minutes and/or seconds, largest first: e.g. 30d, 12h, 90m, 45s or 1d12h ' +
  '(d days, h hours, m minutes, s seconds)';

/** The refusal of an `--older-than` given no value. */
export const MISSING_DURATION = `--older-than needs a duration: ${DURATION_FORM}`;

/** A retention period the command line refuses; the message says what to write instead. */
export class InvalidDurationError extends Error {
  override name = 'InvalidDurationError';
}

/** Milliseconds of a retention period such as `30d`, `12h`, `90m`, `45s` or `1d12h`; refuses anything else. */
export function parseDuration(text: string | undefined): number {
  if (text === undefined || text.trim() === '') {
    throw new InvalidDurationError(MISSING_DURATION);
  }
  const match = DURATION_PATTERN.exec(text.trim());
  if (match === null || match.slice(1).every((part) => part === undefined)) {
    throw new InvalidDurationError(`--older-than "${text}" is not a duration; write ${DURATION_FORM}`);
  }
  const ms = match.slice(1).reduce((sum, part, i) => sum + Number(part ?? 0) * (UNIT_MS[i] ?? 0), 0);
  if (ms === 0) {
    throw new InvalidDurationError(
      `--older-than ${text} would sweep what was stored a moment ago, under runs about to start: ` +
        'give a positive duration, e.g. 7d',
    );
  }
  if (ms > LONGEST_MS) {
    throw new InvalidDurationError(`--older-than ${text} is longer than 100 years; write ${DURATION_FORM}`);
  }
  return ms;
}
