import { Context } from '@temporalio/activity';
import { describeFailure } from '../contract/batch';
import type { AwaitedRun, BatchEntry, RunVerdict } from '../contract/batch';
import type { PipelineResult } from '../contract';
import type { BlobStore } from '../documents/blobs';
import { describeRun, settleLatestRun } from '../runs/latest-run';
import { ManifestReader } from '../documents/manifest';
import { withHeartbeats } from '../steps/heartbeat';

/**
 * The batch workflow's helpers: reading its manifest a page at a time (the workflow holds references, never the
 * list), and deciding what to do when a document's workflow ID is already taken. Both talk to Temporal through
 * the worker's own client.
 */
export function createBatchActivities(deps: { blobs: BlobStore }) {
  const manifests = new ManifestReader(deps.blobs);
  return {
    /** Entries [offset, offset + limit) of the manifest stored under `manifestRef`. */
    async readBatchEntries(input: {
      manifestRef: string;
      offset: number;
      limit: number;
    }): Promise<BatchEntry[]> {
      return manifests.range(input.manifestRef, input.offset, input.limit);
    },

    /**
     * A document's workflow ID was taken when the batch tried to start its run: completed with this version, under
     * way, or held by another version. Decides as every submission does (settleLatestRun), ending a run of an
     * older version under way.
     */
    async inspectRun(input: { workflowId: string; version: string; rerun: boolean }): Promise<RunVerdict> {
      const client = Context.current().client;
      const latest = await describeRun(client, input.workflowId);
      const verdict = await settleLatestRun(client, input.workflowId, latest, input.version, {
        rerun: input.rerun,
      });
      if (verdict.kind === 'start') {
        const sameVersion = latest === undefined || latest.version === input.version;
        const reuse = sameVersion && !input.rerun ? 'ALLOW_DUPLICATE_FAILED_ONLY' : 'ALLOW_DUPLICATE';
        return { kind: 'start', replaced: verdict.replaced, reuse };
      }
      return { kind: verdict.kind, runId: verdict.run.runId };
    },

    /** Waits for a run this batch did not start (another submission's, of the same version) and reports its end. */
    async awaitRun(input: { workflowId: string; runId: string }): Promise<AwaitedRun> {
      const handle = Context.current().client.workflow.getHandle(input.workflowId, input.runId);
      return withHeartbeats(async () => {
        try {
          return { ok: true, result: (await handle.result()) as PipelineResult };
        } catch (err) {
          return { ok: false, ...describeFailure(err) };
        }
      });
    },
  };
}
