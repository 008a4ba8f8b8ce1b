import type { Client, WorkflowHandle, WorkflowHandleWithFirstExecutionRunId } from '@temporalio/client';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import { documentPipeline, progressQuery } from '../../workflows';
import type { BlobStore } from '../documents/blobs';
import type { DocumentFile } from '../documents/files';
import { INPUT_SCHEMA_VERSION, STEPS, workflowIdFor } from '../contract';
import type { PipelineInput, PipelineOptions, PipelineProgress, StepName, StepState } from '../contract';

/** A handle on a document's pipeline run. */
export type PipelineHandle = WorkflowHandle<typeof documentPipeline>;
/** The handle `workflow.start` returns: it also knows the run ID it started. */
export type StartedPipeline = WorkflowHandleWithFirstExecutionRunId<typeof documentPipeline>;

export interface Submission {
  document: DocumentFile;
  workflowId: string;
  handle: PipelineHandle;
  /** `new`: started now; `running`: attached to a run already under way; `completed`: finished before. */
  attachedTo: 'new' | 'running' | 'completed';
}

/**
 * Submits one document. Its text goes to the blob store and the workflow gets the reference. The workflow ID is
 * derived from the document's identity with USE_EXISTING, so submitting a document whose run is still going
 * attaches to it; a run that completed is not repeated (ALLOW_DUPLICATE_FAILED_ONLY), one that failed is retried.
 */
export async function submitDocument(
  client: Client,
  blobs: BlobStore,
  taskQueue: string,
  document: DocumentFile,
  options: Partial<PipelineOptions> = {},
): Promise<Submission> {
  const workflowId = workflowIdFor(document.documentId);
  const input: PipelineInput = {
    schemaVersion: INPUT_SCHEMA_VERSION,
    documentId: document.documentId,
    textRef: blobs.put(document.bytes),
    title: document.title,
    options,
  };
  const submittedAt = Date.now();
  try {
    const handle = await client.workflow.start(documentPipeline, {
      taskQueue,
      workflowId,
      args: [input],
      workflowIdConflictPolicy: 'USE_EXISTING',
      workflowIdReusePolicy: 'ALLOW_DUPLICATE_FAILED_ONLY',
    });
    const { startTime } = await handle.describe();
    // Server clocks and ours differ a little; a run started well before this call was not started by it.
    const attachedTo = startTime.getTime() < submittedAt - 2_000 ? 'running' : 'new';
    return { document, workflowId, handle, attachedTo };
  } catch (err) {
    if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
    return { document, workflowId, handle: client.workflow.getHandle(workflowId), attachedTo: 'completed' };
  }
}

const MARK: Record<StepState, string> = { pending: '·', running: '…', done: '✓', failed: '✗' };

/**
 * Prints each step's state change for every unfinished run until all have ended. Progress comes from the
 * workflow's `progress` query, so it needs a worker; while none is polling, lines simply stop for a while.
 */
export async function followProgress(
  submissions: readonly Submission[],
  print: (line: string) => void = console.log,
  everyMs = 500,
): Promise<void> {
  const shown = new Map<string, string>();
  const ended = new Set<string>();
  const following = submissions.filter((s) => s.attachedTo !== 'completed');
  for (const s of following) {
    s.handle.result().then(
      () => ended.add(s.workflowId),
      () => ended.add(s.workflowId),
    );
  }
  const poll = async (s: Submission): Promise<void> => {
    try {
      const line = describeProgress(await s.handle.query(progressQuery));
      if (shown.get(s.workflowId) === line) return;
      shown.set(s.workflowId, line);
      print(`  ${s.document.title.slice(0, 44).padEnd(44)} ${line}`);
    } catch {
      // The run just closed, or no worker answered in time: the next round (or the result table) tells.
    }
  };
  for (;;) {
    const open = following.filter((s) => !ended.has(s.workflowId));
    // Only open runs: querying a closed run makes a worker replay its whole history just to answer.
    await Promise.all(open.map(poll));
    if (open.length === 0) return;
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

/** One line describing step states, e.g. `summarize ✓  tag …  publish ·`. */
export function describeProgress(progress: PipelineProgress): string {
  return STEPS.map((name: StepName) => `${name} ${MARK[progress.steps[name]]}`).join('  ');
}
