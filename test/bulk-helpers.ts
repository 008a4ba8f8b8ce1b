/**
 * Bulk mode's test parts: a folder of real documents, the batch workflow started over it with bulk mode on, and
 * what the local batch API server (demo/batch-server.ts) saw, counted from outside the workers.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Client, WorkflowHandle } from '@temporalio/client';
import type { Workflow, WorkflowResultType } from '@temporalio/common';
import { BATCH_SCHEMA_VERSION, batchIdFor } from '../src/contract/batch';
import type { BatchInput, BulkSettings } from '../src/contract/batch';
import { LOCAL_BATCH_KEY, startBatchServer } from '../demo/batch-server';
import type { BatchServer, BatchServerOptions } from '../demo/batch-server';
import { loadConfig, SAMPLES_DIR } from '../src/config';
import type { BlobStore } from '../src/documents/blobs';
import { storeDocuments } from '../src/runs/batch-upload';
import type { batch } from '../src/workflow';
import { localParts } from './helpers';
import type { LocalParts } from './helpers';
import type { Defer } from './scratch';
import { scratchDir } from './scratch';

const CORPUS = path.resolve(__dirname, 'fixtures', 'corpus', 'rust-book');

/** A fresh folder of `count` real documents (the samples, then the corpus's chapters), each under a new path. */
export function documentFolder(defer: Defer, count: number): string {
  const dir = scratchDir(defer, 'bulk-docs-');
  const sources = [
    ...fs.readdirSync(SAMPLES_DIR).map((f) => path.join(SAMPLES_DIR, f)),
    ...fs
      .readdirSync(CORPUS)
      .filter((f) => f.endsWith('.md'))
      .map((f) => path.join(CORPUS, f)),
  ];
  if (count > sources.length) throw new Error(`only ${sources.length} documents to copy`);
  for (const source of sources.slice(0, count))
    fs.copyFileSync(source, path.join(dir, path.basename(source)));
  return dir;
}

const MODELS = {
  openai: { MODEL: 'openai:gpt-4o-mini', OPENAI_BASE_URL: '', OPENAI_API_KEY: LOCAL_BATCH_KEY },
  anthropic: {
    MODEL: 'anthropic:claude-haiku-4-5',
    ANTHROPIC_BASE_URL: '',
    ANTHROPIC_API_KEY: LOCAL_BATCH_KEY,
  },
};

/** A batch server, and a worker's parts whose model is `provider` at that server. */
export async function bulkSetup(
  defer: Defer,
  provider: keyof typeof MODELS,
  options: BatchServerOptions,
): Promise<{ server: BatchServer; local: LocalParts }> {
  const server = await startBatchServer(options);
  defer(() => server.close());
  const env: Record<string, string> = { ...MODELS[provider] };
  env[provider === 'openai' ? 'OPENAI_BASE_URL' : 'ANTHROPIC_BASE_URL'] = server.baseUrl;
  const local = await localParts({ dir: scratchDir(defer), model: 'configured', env });
  defer(() => local.close());
  return { server, local };
}

/** Stores the folder's documents and starts the batch workflow over them with bulk mode on. */
export async function startBulkBatch(
  client: Client,
  blobs: BlobStore,
  folder: string,
  taskQueue: string,
  bulk: Partial<BulkSettings>,
  budget?: { id: string; usd?: number; tokens?: number },
): Promise<{ handle: WorkflowHandle<typeof batch>; total: number }> {
  const config = loadConfig({});
  const { manifestRef, total } = await storeDocuments(config, blobs, [folder], {
    concurrency: 4,
    pageSize: undefined,
    signal: undefined,
  });
  if (manifestRef === undefined) throw new Error('no document was stored');
  const input: BatchInput = {
    schemaVersion: BATCH_SCHEMA_VERSION,
    manifestRef,
    total,
    options: {
      window: 8,
      bulk: { maxRequests: 50_000, rounds: 2, pollSeconds: 60, pollMaxSeconds: 1800, ...bulk },
      ...(budget === undefined ? {} : { budget }),
    },
  };
  const handle = await client.workflow.start<typeof batch>('batch', {
    taskQueue,
    workflowId: batchIdFor(manifestRef),
    args: [input],
  });
  return { handle, total };
}

/** What the server's logs say: answers paid per custom_id, and each custom_id's batches. */
export function serverCounts(server: BatchServer): {
  batches: number;
  /** custom_ids whose usable answer was paid more than once. */
  answeredTwice: string[];
  /** Answers paid (usable or refused) over every batch. */
  paid: number;
  /** custom_ids submitted in more than one batch that had not ended. */
  inTwoLiveBatches: string[];
} {
  const answered = new Map<string, number>();
  let paid = 0;
  for (const b of server.batches)
    for (const l of b.lines) {
      if (l.outcome === 'answered') answered.set(l.customId, (answered.get(l.customId) ?? 0) + 1);
      if (l.outcome === 'answered' || l.outcome === 'refused') paid++;
    }
  // Two batches holding one custom_id overlap in time when the second was made before the first ended.
  const inTwoLiveBatches = new Set<string>();
  for (const a of server.batches)
    for (const b of server.batches) {
      if (a === b || b.createdAt < a.createdAt || (a.endedAt !== undefined && a.endedAt <= b.createdAt))
        continue;
      const ids = new Set(a.lines.map((l) => l.customId));
      for (const l of b.lines) if (ids.has(l.customId)) inTwoLiveBatches.add(l.customId);
    }
  return {
    batches: server.batches.length,
    answeredTwice: [...answered].filter(([, n]) => n > 1).map(([id]) => id),
    paid,
    inTwoLiveBatches: [...inTwoLiveBatches],
  };
}

/**
 * The workflow's result, or, past `ms`, a failure that says what its pending activities last failed with (a test
 * never waits without a deadline).
 */
export async function resultWithin<W extends Workflow>(
  handle: WorkflowHandle<W>,
  ms: number,
): Promise<WorkflowResultType<W>> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      void stuckAt(handle)
        .catch((err: unknown) => String(err))
        .then((where) => reject(new Error(`${handle.workflowId} did not end within ${ms} ms: ${where}`)));
    }, ms);
  });
  try {
    return await Promise.race([handle.result(), late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Where a workflow stands: its pending activities, and its open children's (a stuck test says so). */
async function stuckAt(handle: WorkflowHandle): Promise<string> {
  const pendingOf = async (h: WorkflowHandle): Promise<string> => {
    const d = await h.describe();
    const activities = (d.raw.pendingActivities ?? []).map(
      (a) => `${a.activityType?.name} attempt ${a.attempt}: ${a.lastFailure?.message ?? 'no failure'}`,
    );
    const task = d.raw.pendingWorkflowTask;
    const taskLine = task == null ? '' : ` workflow task ${task.state} attempt ${task.attempt}`;
    return `${h.workflowId} ${d.status.name}${taskLine} [${activities.join('; ')}]`;
  };
  const events = (await handle.fetchHistory()).events ?? [];
  const last = events.slice(-6).map((e) => String(e.eventType).replace('EVENT_TYPE_', ''));
  const lines = [`${await pendingOf(handle)}, last events ${last.join(', ')}`];
  const d = await handle.describe();
  for (const child of (d.raw.pendingChildren ?? []).slice(0, 3))
    lines.push(await pendingOf(handle.client.getHandle(child.workflowId ?? '')));
  return lines.join(' | ');
}
