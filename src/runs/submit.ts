import { randomUUID } from 'node:crypto';
import type { Client, WorkflowHandle, WorkflowHandleWithFirstExecutionRunId } from '@temporalio/client';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import type { BlobStore } from '../documents/blobs';
import type { DocumentFile } from '../documents/files';
import {
  DOCUMENT_WORKFLOW,
  INPUT_SCHEMA_VERSION,
  PipelineOptionsSchema,
  PUBLISH_STEP,
  workflowIdFor,
} from '../contract';
import type { DocumentPipeline } from '../contract';
import { stepNames } from '../steps/registry';
import { describeRun, settleLatestRun } from './latest-run';
import type { RunFacts, RunMemo } from './latest-run';

import type { PipelineInput, PipelineOptions, PipelineProgress, StepName, StepState } from '../contract';

/** A handle on a document's pipeline run. */
export type PipelineHandle = WorkflowHandle<DocumentPipeline>;
/** The handle `workflow.start` returns: it also knows the run ID it started. */
export type StartedPipeline = WorkflowHandleWithFirstExecutionRunId<DocumentPipeline>;

export interface Submission {
  document: DocumentFile;
  workflowId: string;
  /** The run that works on this version of the document. */
  runId: string;
  /** That run, by run ID. */
  handle: PipelineHandle;
  /**
   * `new`: started now; `replaced`: started now, ending the run of another version that was under way;
   * `running`: attached to a run of this version already under way; `completed`: this version finished before.
   */
  attachedTo: 'new' | 'replaced' | 'running' | 'completed';
}

/** How many times a submission decides again when other submissions of the document change its runs meanwhile. */
const ROUNDS = 3;

/**
 * Submits one version of a document. Its text goes to the blob store, and the content hash (the blob reference)
 * is the version, recorded in the run's memo. The workflow ID comes from the document ID, so every version of a
 * document runs under one workflow ID, and what happens depends on the latest run there:
 *
 * - none, or one that ended with another version (or with no version recorded): a new run (`new`);
 * - one of this version that failed, was terminated or timed out: a new run (`new`);
 * - one of this version that completed: nothing runs again (`completed`);
 * - one of this version under way: attached to (`running`);
 * - one of another version under way: terminated, since its answers are for a text that is gone, and a new run
 *   started (`replaced`). Its publish may still land, but the publish target orders runs by scheduledAt, so it
 *   can never overwrite this run's.
 *
 * Other submitters may change the runs between the look and the start. The start attaches to a run opened
 * meanwhile (USE_EXISTING) and refuses to repeat a run of this version that completed meanwhile
 * (ALLOW_DUPLICATE_FAILED_ONLY unless the latest run seen is of another version); then the submission decides
 * again. Only the run that was seen is terminated, never one another submitter just started for this version.
 */
export async function submitDocument(
  client: Client,
  blobs: BlobStore,
  taskQueue: string,
  document: DocumentFile,
  options: Partial<PipelineOptions> = {},
  extra: Pick<PipelineInput, 'agent'> = {},
): Promise<Submission> {
  const workflowId = workflowIdFor(document.documentId);
  const version = await blobs.put(document.bytes);
  const completeOptions = PipelineOptionsSchema.safeParse(options);
  const input: PipelineInput = {
    schemaVersion: INPUT_SCHEMA_VERSION,
    documentId: document.documentId,
    textRef: version,
    title: document.title,
    // Complete, with the defaults filled in: the workflow takes such an input as it is (completePipelineInput).
    // Options it would refuse go as they are, and the run fails saying what is wrong with them.
    options: completeOptions.success ? completeOptions.data : options,
    // The run's agent steps, when its submitter turns them on (docs/agent.md).
    ...(extra.agent === undefined ? {} : { agent: extra.agent }),
  };
  const submission = randomUUID();
  const found = (run: RunFacts, attachedTo: Submission['attachedTo']): Submission => ({
    document,
    workflowId,
    runId: run.runId,
    handle: client.workflow.getHandle<DocumentPipeline>(workflowId, run.runId),
    attachedTo,
  });
  let replaced = false;
  for (let round = 0; round < ROUNDS; round++) {
    const latest = await describeRun(client, workflowId);
    const verdict = await settleLatestRun(client, workflowId, latest, version);
    if (verdict.kind === 'completed') return found(verdict.run, 'completed');
    if (verdict.kind === 'running') return found(verdict.run, 'running');
    replaced ||= verdict.replaced;
    const sameVersion = latest?.version === version;
    let started: StartedPipeline;
    try {
      started = await client.workflow.start<DocumentPipeline>(DOCUMENT_WORKFLOW, {
        taskQueue,
        workflowId,
        args: [input],
        memo: { version, submission } satisfies RunMemo,
        workflowIdConflictPolicy: 'USE_EXISTING',
        workflowIdReusePolicy:
          latest === undefined || sameVersion ? 'ALLOW_DUPLICATE_FAILED_ONLY' : 'ALLOW_DUPLICATE',
      });
    } catch (err) {
      // This version completed meanwhile (or, with no run seen, some version did): look again.
      if (err instanceof WorkflowExecutionAlreadyStartedError) continue;
      throw err;
    }
    const run = await describeRun(client, workflowId, started.firstExecutionRunId);
    if (run?.submission === submission) return found(run, replaced ? 'replaced' : 'new');
    if (run?.version === version) return found(run, 'running');
    // USE_EXISTING attached to a run another submitter started meanwhile, of another version: decide again.
  }
  throw new Error(
    `${workflowId} kept changing while it was submitted (other versions of the document are being submitted ` +
      'at the same time); submit it again once they are done',
  );
}

const MARK: Record<StepState, string> = {
  pending: '·',
  running: '…',
  done: '✓',
  failed: '✗',
  held: '⏸ held',
  budget: '⏸ waiting for budget',
};

/** One line describing step states, e.g. `summarize ✓  tag …  publish ·`. */
export function describeProgress(progress: PipelineProgress): string {
  return stepNames()
    .map((name: StepName) => {
      const line = `${name} ${MARK[progress.steps[name] ?? 'pending']}`;
      // A run with a review shows it before publish: `review ⏸ awaiting`, then how it ended.
      if (name !== PUBLISH_STEP || progress.review === undefined) return line;
      const review = progress.review === 'awaiting' ? '⏸ awaiting' : `✓ ${progress.review}`;
      return `review ${review}  ${line}`;
    })
    .join('  ');
}
