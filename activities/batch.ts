import { Context } from '@temporalio/activity';
import type { z } from 'zod';
import { BatchManifestSchema, describeFailure, ManifestPageSchema } from '../src/batch-contract';
import type { AwaitedRun, BatchEntry, RunVerdict } from '../src/batch-contract';
import { parseOrFail } from '../src/contract';
import type { PipelineResult } from '../src/contract';
import type { BlobStore } from '../src/documents/blobs';
import { describeRun, settleLatestRun } from '../src/runs/latest-run';
import { withHeartbeats } from './heartbeat';

/**
 * The batch workflow's helpers: reading its manifest a page at a time (the workflow holds references, never the
 * list), and deciding what to do when a document's workflow ID is already taken. Both talk to Temporal through
 * the worker's own client.
 */
export function createBatchActivities(deps: { blobs: BlobStore }) {
  // A manifest and its pages never change (a reference is its content's hash), so each is read and checked once
  // and kept for the reads that follow: reading a manifest whole for every page made a batch's reads grow with
  // the square of its size. The last few are kept, for batches running side by side.
  const kept = new Map<string, Promise<unknown>>();
  const parsed = <T>(ref: string, schema: z.ZodType<T>, what: string): Promise<T> => {
    let read = kept.get(ref) as Promise<T> | undefined;
    if (read === undefined) {
      read = readStored(deps.blobs, ref, schema, what);
      kept.set(ref, read);
      // A failed read is not kept: the next page tries again.
      read.catch(() => kept.delete(ref));
      const oldest = kept.keys().next().value;
      if (kept.size > KEPT_BLOBS && oldest !== undefined) kept.delete(oldest);
    }
    return read;
  };
  return {
    /** Entries [offset, offset + limit) of the manifest stored under `manifestRef`. */
    async readBatchEntries(input: {
      manifestRef: string;
      offset: number;
      limit: number;
    }): Promise<BatchEntry[]> {
      const { manifestRef, offset, limit } = input;
      const manifest = await parsed(manifestRef, BatchManifestSchema, 'batch manifest');
      if ('entries' in manifest) return manifest.entries.slice(offset, offset + limit);
      const end = Math.min(offset + limit, manifest.total);
      const out: BatchEntry[] = [];
      // The pages the range spans: a short page (only the last may be) ends the read, and the batch says so.
      for (let index = offset; index < end;) {
        const pageNumber = Math.floor(index / manifest.pageSize);
        const pageRef = manifest.pages[pageNumber];
        if (pageRef === undefined) break;
        const page = await parsed(
          pageRef,
          ManifestPageSchema,
          `page ${pageNumber + 1} of batch manifest ${manifestRef}`,
        );
        const from = index - pageNumber * manifest.pageSize;
        const taken = page.entries.slice(from, from + (end - index));
        if (taken.length === 0) break;
        out.push(...taken);
        index += taken.length;
      }
      return out;
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

/** Manifests and manifest pages a worker keeps parsed: a few batches' current pages. */
const KEPT_BLOBS = 8;

async function readStored<T>(blobs: BlobStore, ref: string, schema: z.ZodType<T>, what: string): Promise<T> {
  const bytes = await blobs.get(ref);
  if (bytes === undefined) {
    throw new Error(
      `${what} ${ref} is not in ${blobs.where}; workers and clients must share ` +
        'one store (the same DATABASE_URL, or without it the same DATA_DIR)',
    );
  }
  return parseOrFail(schema, JSON.parse(bytes.toString('utf8')), what);
}
