/**
 * Bulk mode from the outside, as a user runs it: `npm run pipeline -- --bulk <folder>` against real worker
 * processes (npm run worker's wiring) and a dev server on a database file, with the provider's batch API played by
 * a local server (demo/batch-server.ts). The workers are SIGKILLed at each boundary: right after the
 * provider accepted the batch, before the create's answer reached the worker; while the workflow waits; and after
 * the results were asked for, before they were in the memo; and the server is restarted while the batch waits.
 * From the batch server's own log: one provider batch, every custom_id in it once and answered once, no call one
 * by one, and each document published once.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { LOCAL_BATCH_KEY, startBatchServer } from '../demo/batch-server';
import type { WorkerProcess } from '../demo/worker-process';
import { dataPaths, loadConfig } from '../src/config';
import { freeLoopbackPort } from '../src/lib/loopback';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { startLocalDevServer } from '../src/temporal/local-server';
import { documentFolder, serverCounts } from './bulk-helpers';
import {
  CRASH_WORKER_DEFAULTS,
  installQuietRuntime,
  startCrashableWorker,
  writeWorkflowBundle,
} from './helpers';
import { baseEnvironment, runCommand } from './provider-limits-run';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
installQuietRuntime();
let bundlePath: string;

before(async () => {
  bundlePath = await writeWorkflowBundle(scratchDir(defer, 'bulk-crash-bundle-'));
});

/** Waits for `condition`, checking every 100 ms, failing with `what` past the deadline. */
async function until(condition: () => boolean, what: string, ms = 180_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    assert.ok(Date.now() < deadline, `${what} did not happen within ${ms / 1000} s`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe('bulk mode through crashes', () => {
  it(
    'submits one provider batch and pays each answer once through SIGKILLs at each boundary and a server restart',
    { timeout: 400_000 },
    async () => {
      const documents = 5;
      const folder = documentFolder(defer, documents);
      const dir = scratchDir(defer, 'bulk-crash-');
      const dbFile = path.join(dir, 'temporal.db');
      const port = await freeLoopbackPort();
      const config = loadConfig();
      let server: TestWorkflowEnvironment = await startLocalDevServer(config, { port, dbFilename: dbFile });
      defer(() => server.teardown());
      const workers: WorkerProcess[] = [];
      defer(async () => {
        for (const w of workers) if (w.child.exitCode === null && w.child.signalCode === null) await w.kill();
      });
      const current = (): WorkerProcess | undefined => workers.at(-1);
      const kills: string[] = [];
      const killCurrent = async (why: string): Promise<void> => {
        const worker = current();
        if (worker === undefined) return;
        kills.push(`${why}: ${await worker.kill()}`);
      };

      // The provider: held open until the test lets it end; kills at the create and at the first results.
      let release = false;
      let killedAtCreate = false;
      let killedAtResults = false;
      const provider = await startBatchServer({
        completeWhen: () => release,
        afterCreate: async () => {
          if (killedAtCreate) return;
          killedAtCreate = true;
          await killCurrent('after the create, before it was recorded');
        },
        beforeResults: async () => {
          if (killedAtResults) return;
          killedAtResults = true;
          await killCurrent('after the results were asked for, before they were in the memo');
        },
      });
      defer(() => provider.close());

      const env: NodeJS.ProcessEnv = {
        ...baseEnvironment(),
        TEMPORAL_ADDRESS: `127.0.0.1:${port}`,
        TEMPORAL_NAMESPACE: 'default',
        TEMPORAL_TASK_QUEUE: `bulk-crash-${randomUUID()}`,
        DATA_DIR: path.join(dir, 'data'),
        MODEL: 'openai:gpt-4o-mini',
        OPENAI_BASE_URL: provider.baseUrl,
        OPENAI_API_KEY: LOCAL_BATCH_KEY,
        BULK_POLL_SECONDS: '1',
        BULK_POLL_MAX_SECONDS: '2',
        LOG_LEVEL: 'warn',
      };
      const worker = async (): Promise<void> => {
        workers.push(
          await startCrashableWorker({
            ...(env as Record<string, string>),
            WORKFLOW_BUNDLE_PATH: bundlePath,
            ...CRASH_WORKER_DEFAULTS,
          }),
        );
      };

      await worker();
      // The client submits and follows; it is let go once the batch is under way, and asked again at the end.
      const first = runCommand('pipeline', ['--bulk', folder], env, 300_000, defer);

      // 1. Killed after the provider accepted the batch, before the worker heard: the next attempt finds it.
      await until(() => killedAtCreate && kills.length === 1, 'the kill at the create');
      await worker();
      // 2. Killed while the workflow waits on its timers, between two looks at the provider.
      await until(() => provider.calls.some((c) => c.action === 'retrieve'), 'a look at the provider batch');
      await killCurrent('while waiting');
      await worker();
      const looks = provider.calls.filter((c) => c.action === 'retrieve').length;
      await until(
        () => provider.calls.filter((c) => c.action === 'retrieve').length > looks + 1,
        'a look by the next worker',
      );
      // 3. The server restarted while the batch waits (its database file keeps the history).
      await server.teardown();
      server = await startLocalDevServer(config, { port, dbFilename: dbFile });
      const afterRestart = provider.calls.filter((c) => c.action === 'retrieve').length;
      await until(
        () => provider.calls.filter((c) => c.action === 'retrieve').length > afterRestart,
        'a look after the restart',
      );
      // 4. The provider ends the batch; the worker is killed as it asks for the results.
      release = true;
      await until(() => killedAtResults && kills.length === 3, 'the kill at the results');
      await worker();

      const client = await first;
      // While the batch waited, the client said so, with the provider batch's state and counts.
      assert.match(
        client.output,
        /BULK waiting, round 1: batch_\w+ (validating|in_progress), 0 of 10 answered/,
      );
      // Whether the first client lived through the restart or not, submitting again attaches and reports.
      const again =
        client.code === 0 ? client : await runCommand('pipeline', ['--bulk', folder], env, 300_000, defer);
      assert.equal(again.code, 0, again.output);
      assert.match(again.output, new RegExp(`${documents} of ${documents} document\\(s\\) published`));
      assert.match(again.output, /Bulk: 1 provider batch\(es\)/);
      // Each document published once: revision 1, and no second revision of any.
      assert.equal(again.output.match(/published r1\b/g)?.length, documents, again.output);
      assert.doesNotMatch(again.output, /published r[2-9]/);
      assert.match(again.output, /one by one they would have cost \$[\d.]+ \(saved \$[\d.]+\)/);

      const counts = serverCounts(provider);
      assert.equal(counts.batches, 1, 'a second provider batch was created');
      const batch = provider.batches[0]!;
      assert.equal(batch.status, 'completed');
      assert.equal(batch.lines.length, documents * 2);
      assert.equal(new Set(batch.lines.map((l) => l.customId)).size, documents * 2);
      assert.deepEqual(counts.answeredTwice, []);
      assert.equal(provider.direct.length, 0, 'a document step called the model one by one');
      const store = new SqlitePublicationStore(dataPaths(env.DATA_DIR ?? '').publications);
      defer(() => store.close());
      assert.equal(await store.countPublications(), documents);
      assert.deepEqual(kills.length, 3, kills.join('; '));
      console.log(
        `bulk-crash: kills: ${kills.join('; ')}; provider batches ${counts.batches}, custom_ids ` +
          `${batch.lines.length}, answered twice ${counts.answeredTwice.length}, one-by-one calls ` +
          `${provider.direct.length}, published ${await store.countPublications()} of ${documents}`,
      );
    },
  );
});
