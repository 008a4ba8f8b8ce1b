/**
 * A review survives what the rest of the pipeline survives, on a dev server with a database file and real worker
 * processes: the worker SIGKILLed while the draft awaits review, the server restarted while it awaits, and the
 * next worker SIGKILLed right after the approved publication committed. One publication, the decision kept.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { dataPaths, loadConfig } from '../src/config';
import { FileBlobStore } from '../src/documents/blobs';
import { freeLoopbackPort } from '../src/lib/loopback';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { decide } from '../src/runs/review-queue';
import { startLocalDevServer } from '../src/temporal/local-server';
import { reviewQuery } from '../src/workflow';
import type { documentPipeline } from '../workflows';
import {
  CRASH_WORKER_DEFAULTS,
  installQuietRuntime,
  pipelineInput,
  SAMPLE_TEXT,
  startCrashableWorker,
  writeWorkflowBundle,
} from './helpers';
import type { WorkerProcess } from '../demo/worker-process';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
installQuietRuntime();
let bundlePath: string;

before(async () => {
  bundlePath = await writeWorkflowBundle(scratchDir(defer, 'review-crash-bundle-'));
});

describe('a review through crashes', () => {
  it(
    'keeps the draft through a worker SIGKILL and a server restart, and publishes once after a kill right after the approved publish',
    { timeout: 240_000 },
    async () => {
      const dbFile = path.join(scratchDir(defer, 'review-crash-server-'), 'temporal.db');
      const port = await freeLoopbackPort();
      const config = loadConfig();
      let env: TestWorkflowEnvironment = await startLocalDevServer(config, { port, dbFilename: dbFile });
      defer(() => env.teardown());
      const dataDir = scratchDir(defer, 'review-crash-data-');
      const taskQueue = `review-crash-${randomUUID()}`;
      const workers: WorkerProcess[] = [];
      defer(async () => {
        for (const w of workers) if (w.child.exitCode === null && w.child.signalCode === null) await w.kill();
      });
      const worker = async (extra: Record<string, string> = {}): Promise<WorkerProcess> => {
        const started = await startCrashableWorker({
          TEMPORAL_ADDRESS: `127.0.0.1:${port}`,
          TEMPORAL_NAMESPACE: 'default',
          TEMPORAL_TASK_QUEUE: taskQueue,
          WORKFLOW_BUNDLE_PATH: bundlePath,
          DATA_DIR: dataDir,
          MODEL: '',
          ...CRASH_WORKER_DEFAULTS,
          ...extra,
        });
        workers.push(started);
        return started;
      };
      const input = {
        ...(await pipelineInput(new FileBlobStore(dataPaths(dataDir).blobs), SAMPLE_TEXT)),
        review: { timeoutMinutes: 24 * 60, onTimeout: 'reject' as const },
      };
      const workflowId = `review-crash-${randomUUID()}`;
      const draftOf = async () =>
        env.client.workflow.getHandle<typeof documentPipeline>(workflowId).query(reviewQuery);

      const first = await worker();
      await env.client.workflow.start('documentPipeline', { taskQueue, workflowId, args: [input] });
      const deadline = Date.now() + 60_000;
      while ((await draftOf()) === undefined) {
        assert.ok(Date.now() < deadline, 'the draft never came to await review');
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      const drafted = await draftOf();
      assert.equal(await first.kill(), 'SIGKILL');

      // The server goes down and comes back on its database file while the draft waits.
      await env.teardown();
      env = await startLocalDevServer(config, { port, dbFilename: dbFile });

      // The next worker takes the decision, publishes, and is SIGKILLed right after the publication committed.
      const second = await worker({ CRASH_AFTER_PUBLISH: '1' });
      assert.deepEqual((await draftOf())?.fields, drafted?.fields, 'the draft changed across the restart');
      const approved = await decide(env.client, workflowId, { action: 'approve', reviewer: 'ana' });
      assert.ok(approved.ok, approved.ok ? '' : approved.refused);
      const published = await Promise.race([
        second.exited.then(() => true),
        new Promise<false>((resolve) => setTimeout(() => resolve(false), 60_000).unref()),
      ]);
      assert.ok(published, 'the approved draft was never published (the worker never reached its kill)');
      await worker();
      const result = await env.client.workflow.getHandle<typeof documentPipeline>(workflowId).result();

      assert.equal(result.review?.outcome, 'approved');
      assert.equal(result.review?.reviewer, 'ana');
      assert.equal(result.publication?.revision, 1);
      assert.equal(
        result.publication?.duplicate,
        true,
        'the retry after the kill was not answered as a duplicate',
      );
      const store = new SqlitePublicationStore(dataPaths(dataDir).publications);
      defer(() => store.close());
      assert.equal(await store.countPublications(), 1, 'published more than once');
      const stored = await store.currentPublication(input.documentId);
      assert.equal((stored?.fields.review as { reviewer?: string } | undefined)?.reviewer, 'ana');
      const events = (await env.client.workflow.getHandle(workflowId).fetchHistory()).events ?? [];
      assert.equal(events.filter((e) => e.workflowExecutionUpdateAcceptedEventAttributes).length, 1);
    },
  );
});
