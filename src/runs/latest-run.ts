import type { Client } from '@temporalio/client';
import { WorkflowNotFoundError } from '@temporalio/client';
import { z } from 'zod';
import { TextRefSchema } from '../contract';

/**
 * The latest run under a document's workflow ID, as every submission reads it (submitDocument from a client, the
 * batch workflow through its inspectRun activity): its facts, its memo, and the one decision about it. No
 * workflow code here, so activities can use it.
 */

/** What a submission needs to know of a run: its ID, whether it is over, and what its memo records. */
export interface RunFacts {
  runId: string;
  open: boolean;
  completed: boolean;
  /** The version the run works on; undefined for runs started before versions were recorded. */
  version: string | undefined;
  /** The submission that started it. */
  submission: string | undefined;
}

/**
 * What a run's Temporal memo records, read back by this module and by the sweep: the version (the blob
 * reference of the text) the run works on, and the submission that started it. Runs from before versions were
 * recorded have neither.
 */
const RunMemoSchema = z.object({
  version: TextRefSchema.optional().catch(undefined),
  submission: z.string().optional().catch(undefined),
});
export type RunMemo = z.infer<typeof RunMemoSchema>;

/** A run's memo as RunMemo; fields missing or of another shape are undefined. */
export function runMemo(memo: Record<string, unknown> | undefined): RunMemo {
  return RunMemoSchema.parse(memo ?? {});
}

/** What to do about the latest run under a document's workflow ID, for one version of the document. */
export type LatestRunVerdict =
  | { kind: 'completed'; run: RunFacts }
  | { kind: 'running'; run: RunFacts }
  | { kind: 'start'; replaced: boolean };

/**
 * The one decision every submission makes (submitDocument here, the batch workflow through its inspectRun
 * activity): this version completed (nothing runs again, unless `rerun`), or is under way (attach), or nothing
 * blocks a new run. A run of another version under way is terminated first, since its answers are for a text that
 * is gone (`replaced`); only the run that was seen, never one another submitter just started.
 */
export async function settleLatestRun(
  client: Client,
  workflowId: string,
  latest: RunFacts | undefined,
  version: string,
  { rerun = false }: { rerun?: boolean } = {},
): Promise<LatestRunVerdict> {
  const sameVersion = latest?.version === version;
  if (latest?.open === true && sameVersion) return { kind: 'running', run: latest };
  if (latest?.completed === true && sameVersion && !rerun) return { kind: 'completed', run: latest };
  if (latest?.open === true) {
    await terminateRun(client, workflowId, latest.runId, `replaced by version ${version} of the document`);
    return { kind: 'start', replaced: true };
  }
  return { kind: 'start', replaced: false };
}

/** The facts of one run, or of the latest run under the workflow ID without `runId`; undefined if there is none. */
export async function describeRun(
  client: Client,
  workflowId: string,
  runId?: string,
): Promise<RunFacts | undefined> {
  try {
    const { memo, ...run } = await client.workflow.getHandle(workflowId, runId).describe();
    const { version, submission } = runMemo(memo);
    return {
      runId: run.runId,
      open: run.closeTime === undefined,
      completed: run.status.name === 'COMPLETED',
      version,
      submission,
    };
  } catch (err) {
    if (err instanceof WorkflowNotFoundError) return undefined;
    throw err;
  }
}

/** Terminates one run by its run ID; a run that ended meanwhile is left as it is. */
async function terminateRun(
  client: Client,
  workflowId: string,
  runId: string,
  reason: string,
): Promise<void> {
  try {
    await client.workflow.getHandle(workflowId, runId).terminate(reason);
  } catch (err) {
    if (!(err instanceof WorkflowNotFoundError)) throw err;
  }
}
