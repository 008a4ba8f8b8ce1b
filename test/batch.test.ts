/**
 * The batch workflow on a dev server with a real worker: a sliding window of document runs, continue-
 * as-new without losing or repeating a document, documents done or under way elsewhere attached to rather than
 * rerun, `--rerun`, failures listed with their step, and the same documents submitted twice landing in one batch.
 */
import '../src/cli/compose';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import { Client, Connection, defaultGrpcRetryOptions, makeGrpcRetryInterceptor } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { batch, deliverySettledSignal } from '../src/workflow';
import {
  BATCH_SCHEMA_VERSION,
  BatchInputSchema,
  BatchManifestSchema,
  batchIdFor,
} from '../src/contract/batch';
import type { BatchEntry } from '../src/contract/batch';
import { createBatchActivities } from '../src/batch/activities';
import { loadConfig } from '../src/config';
import { workflowIdFor } from '../src/contract';
import { FileBlobStore } from '../src/documents/blobs';
import type { BlobStore } from '../src/documents/blobs';
import { documentIdOf } from '../src/documents/files';
import { processDocuments } from '../src/runs/batch';
import { submitDocument } from '../src/runs/submit';
import {
  closeServer,
  devServerEnv,
  installQuietRuntime,
  listenOnLoopback,
  pipelineWorker,
  SAMPLE_TEXT,
  scratchLedger,
  tempParts,
  until,
  webhookPublisher,
} from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';
import { openClaimOf } from './helpers';
import type { LocalParts } from './helpers';

const defer = cleanupAfterAll();
const ROOT = path.join(__dirname, '..');
installQuietRuntime();
/**
 * A dev server, not the time-skipping one: batches wait in real time (memo leases, a client waiting on a batch) and
 * on the time-skipping server a busy machine let skipped time outrun them; it also describes task queues.
 */
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

/** `count` distinct documents in a fresh folder, named doc-00.md, doc-01.md, ... */
function folderOf(count: number, tag = randomUUID()): { dir: string; files: string[] } {
  const dir = scratchDir(defer, 'batch-docs-');
  const files = Array.from({ length: count }, (_, i) => {
    const file = path.join(dir, `doc-${String(i).padStart(2, '0')}.md`);
    fs.writeFileSync(file, `# Document ${i} ${tag}\n\n${SAMPLE_TEXT}\n`);
    return file;
  });
  return { dir, files };
}

async function setup(): Promise<{
  local: LocalParts;
  taskQueue: string;
  config: ReturnType<typeof loadConfig>;
}> {
  const local = await tempParts(defer);
  const taskQueue = `batch-${randomUUID()}`;
  const config = loadConfig({ DATA_DIR: local.dir, TEMPORAL_TASK_QUEUE: taskQueue });
  return { local, taskQueue, config };
}

/** Every document of `files` published exactly once, as revision 1. */
async function publishedOnce(local: LocalParts, files: readonly string[]): Promise<void> {
  for (const file of files) {
    const revisions = await local.store.revisionsOf(documentIdOf(file));
    assert.equal(revisions.length, 1, `${file}: ${JSON.stringify(revisions)}`);
    assert.equal(revisions[0]?.revision, 1);
  }
}

describe('the batch workflow', () => {
  it('continues as new before its history budget, and every document is published once', async () => {
    const { local, taskQueue, config } = await setup();
    const { dir, files } = folderOf(30);
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const lines: string[] = [];

    const report = await worker.runUntil(
      processDocuments(env.client, config, local.blobs, [dir], {
        window: 4,
        historyBudget: 80,
        // The manifest in pages of 7 (the last of 2), as a big batch's: the batch reads across their boundaries.
        manifestPageSize: 7,
        everyMs: 200,
        print: (line) => lines.push(line),
      }),
    );

    assert.equal(report.exitCode, 0, lines.join('\n'));
    assert.equal(report.tally?.done, 30);
    assert.equal(report.tally?.failed, 0);
    for (const step of ['summarize', 'tag', 'publish'] as const)
      assert.equal(report.tally?.steps[step]?.done, 30);
    await publishedOnce(local, files);
    assert.equal(await local.store.countPublications(), 30);
    // Each run of the batch stayed near its budget: it drains its window (4 documents) before continuing.
    const runs: number[] = [];
    const batchId = report.batchId ?? '';
    const latest = await env.client.workflow.getHandle(batchId).fetchHistory();
    let runId = latest.events?.[0]?.workflowExecutionStartedEventAttributes?.firstExecutionRunId ?? undefined;
    while (runId) {
      const events = (await env.client.workflow.getHandle(batchId, runId).fetchHistory()).events ?? [];
      runs.push(events.length);
      runId = events.at(-1)?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId ?? undefined;
    }
    assert.ok(runs.length > 1, `the batch never continued as new: ${JSON.stringify(runs)}`);
    assert.ok(Math.max(...runs) < 80 + 4 * 12, `a run of the batch grew to ${Math.max(...runs)} events`);
    assert.ok(
      lines.includes(`The batch continued as new ${runs.length - 1} time(s) to keep its history short.`),
      lines.join('\n'),
    );
    // The batch got the manifest of pages: 30 entries in 5 pages.
    const payload = latest.events?.[0]?.workflowExecutionStartedEventAttributes?.input?.payloads?.[0]?.data;
    const { manifestRef } = BatchInputSchema.parse(JSON.parse(Buffer.from(payload ?? []).toString('utf8')));
    const manifest = BatchManifestSchema.parse(
      JSON.parse((await local.blobs.get(manifestRef))?.toString('utf8') ?? 'null'),
    );
    assert.ok('pages' in manifest, JSON.stringify(manifest));
    assert.deepEqual([manifest.pages.length, manifest.pageSize, manifest.total], [5, 7, 30]);
  });

  it('attaches to documents done or under way elsewhere instead of running them again', async () => {
    const { local, taskQueue, config } = await setup();
    const { dir, files } = folderOf(3);
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const [first, second] = files;
    assert.ok(first !== undefined && second !== undefined);

    const lines: string[] = [];
    const report = await worker.runUntil(async () => {
      // The first document completes on its own before the batch; the batch must not run it again.
      const done = await submitDocument(env.client, local.blobs, taskQueue, {
        source: first,
        documentId: documentIdOf(first),
        title: 'First',
        bytes: fs.readFileSync(first),
      });
      await done.handle.result();
      return processDocuments(env.client, config, local.blobs, [dir], {
        everyMs: 200,
        print: (line) => lines.push(line),
      });
    });

    assert.equal(report.exitCode, 0, lines.join('\n'));
    assert.equal(report.tally?.done, 3);
    assert.equal(report.tally?.doneEarlier, 1);
    assert.ok(
      lines.includes(`${first} -> ${workflowIdFor(documentIdOf(first))} (already done earlier)`),
      lines.join('\n'),
    );
    assert.ok(
      lines.includes(`${second} -> ${workflowIdFor(documentIdOf(second))} (started)`),
      lines.join('\n'),
    );
    await publishedOnce(local, files);
    // Two model answers per document, none paid twice.
    assert.equal(await local.memo.count(), 6);
  });

  it('runs them anew with rerun, publishing the next revision', async () => {
    const { local, taskQueue, config } = await setup();
    const { dir, files } = folderOf(2);
    const worker = await pipelineWorker(env, taskQueue, local.deps);

    const [once, again] = await worker.runUntil(async () => [
      await processDocuments(env.client, config, local.blobs, [dir], { everyMs: 200, print: () => {} }),
      await processDocuments(env.client, config, local.blobs, [dir], {
        everyMs: 200,
        print: () => {},
        rerun: true,
      }),
    ]);

    assert.equal(once?.tally?.done, 2);
    assert.equal(again?.tally?.doneEarlier, 0);
    assert.notEqual(again?.batchId, once?.batchId);
    for (const file of files) {
      const revisions = await local.store.revisionsOf(documentIdOf(file));
      assert.deepEqual(
        revisions.map((r) => r.revision),
        [1, 2],
      );
    }
  });

  it('lists a failed document with its step and reason, and publishes the others', async () => {
    const { local, taskQueue } = await setup();
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const good = await local.blobs.put(Buffer.from(`# Good ${randomUUID()}\n\n${SAMPLE_TEXT}`));
    // A reference to a text that is in no store: the model steps fail for good, saying what to fix.
    const missing = `sha256:${'0'.repeat(64)}`;
    const entries: BatchEntry[] = [
      { documentId: `good-${randomUUID()}`, textRef: good, title: 'Good', source: 'good.md' },
      { documentId: `lost-${randomUUID()}`, textRef: missing, title: 'Lost', source: 'lost.md' },
    ];
    const manifestRef = await local.blobs.put(Buffer.from(JSON.stringify({ entries })));

    const result = await worker.runUntil(
      env.client.workflow.execute(batch, {
        taskQueue,
        workflowId: batchIdFor(manifestRef),
        args: [{ schemaVersion: BATCH_SCHEMA_VERSION, manifestRef, total: entries.length }],
      }),
    );

    assert.equal(result.tally.done, 1);
    assert.equal(result.tally.failed, 1);
    assert.equal(result.failures.length, 1);
    const [failure] = result.failures;
    assert.equal(failure?.source, 'lost.md');
    assert.ok(failure?.step === 'summarize' || failure?.step === 'tag', JSON.stringify(failure));
    assert.match(failure?.reason ?? '', /is not in .*submit the document again/);
    assert.equal(await local.store.countPublications(), 1);
  });

  it('is what npm run pipeline runs: the client process follows the batch, prints its end and exits', async () => {
    const { local, taskQueue } = await setup();
    const { dir } = folderOf(3);
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const client = spawn(
      process.execPath,
      ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'pipeline.ts'), dir],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          TEMPORAL_ADDRESS: env.address,
          TEMPORAL_TASK_QUEUE: taskQueue,
          DATA_DIR: local.dir,
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let output = '';
    client.stdout.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
    client.stderr.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
    const exited = new Promise<number | null>((resolve) => client.once('exit', resolve));
    defer(() => void client.kill('SIGKILL'));

    const code = await worker.runUntil(
      Promise.race([
        exited,
        sleep(60_000, undefined, { ref: false }).then(() => 'still running after 60 s' as const),
      ]),
    );

    assert.equal(code, 0, output);
    assert.match(output, /Batch batch-[0-9a-f]+: 3 document\(s\), 16 at a time\./);
    assert.match(output, /3 of 3 document\(s\) published, 0 failed\./);
  });

  it('says so when no worker polls the task queue, and carries on once one does', async () => {
    const { local, taskQueue, config } = await setup();
    const { dir, files } = folderOf(2);
    const lines: string[] = [];
    const said = (pattern: RegExp): boolean => lines.some((l) => pattern.test(l));
    const processing = processDocuments(env.client, config, local.blobs, [dir], {
      everyMs: 200,
      print: (line) => lines.push(line),
    });

    for (let waited = 0; !said(/No worker is polling/) && waited < 15_000; waited += 100) await sleep(100);
    assert.ok(
      lines.includes(
        `No worker is polling task queue "${taskQueue}": start one with npm run worker ` +
          '(the batch waits, nothing is lost).',
      ),
      lines.join('\n'),
    );
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const report = await worker.runUntil(processing);

    assert.equal(report.exitCode, 0, lines.join('\n'));
    assert.ok(said(/^A worker is polling task queue ".*": carrying on\.$/), lines.join('\n'));
    await publishedOnce(local, files);
  });

  it('lets go of every call to Temporal when its signal stops the follow, and the batch carries on', async () => {
    const { local, taskQueue, config } = await setup();
    const { dir, files } = folderOf(2);
    // Counts the calls out on this connection: outermost, so a call whose retry waits on its timer still counts.
    // None may outlive the follow (npm start closes the connection next, and a call out then would retry on the
    // closed channel and crash the process).
    let out = 0;
    const counting: grpc.Interceptor = (options, nextCall) =>
      new grpc.InterceptingCall(nextCall(options), {
        start(metadata, _listener, next) {
          out += 1;
          next(
            metadata,
            new grpc.ListenerBuilder()
              .withOnReceiveStatus((status, nextStatus) => {
                out -= 1;
                nextStatus(status);
              })
              .build(),
          );
        },
      });
    const connection = await Connection.connect({
      address: env.address,
      interceptors: [counting, makeGrpcRetryInterceptor(defaultGrpcRetryOptions())],
    });
    defer(() => connection.close());
    const client = new Client({ connection });
    const lines: string[] = [];
    const follow = new AbortController();
    // No worker yet: the follow waits on the progress query, which only a worker answers.
    const processing = processDocuments(client, config, local.blobs, [dir], {
      everyMs: 200,
      print: (line) => lines.push(line),
      signal: follow.signal,
    });
    const settled = processing.then(
      () => 'finished',
      (err: unknown) => (err === follow.signal.reason ? 'stopped' : err),
    );
    await until(() => lines.some((l) => l.startsWith('Batch ')) && out > 0, 'the batch followed', 15_000);

    const stoppedAt = Date.now();
    follow.abort();

    assert.equal(await Promise.race([settled, sleep(10_000).then(() => 'still following')]), 'stopped');
    assert.ok(Date.now() - stoppedAt < 5_000, `the follow took ${Date.now() - stoppedAt} ms to stop`);
    assert.equal(out, 0, 'a call to Temporal outlived the follow');
    // Stopping the follow stopped nothing else: a worker finishes the batch, followed again from the start.
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const report = await worker.runUntil(
      processDocuments(env.client, config, local.blobs, [dir], { everyMs: 200, print: () => {} }),
    );
    assert.equal(report.tally?.done, 2);
    await publishedOnce(local, files);
  });

  it('follows a batch with many calls without piling listeners on its signal; a stopped signal makes none', async () => {
    const { local, taskQueue, config } = await setup();
    const { dir } = folderOf(12);
    const warnings: Error[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning);
    process.on('warning', onWarning);
    defer(() => void process.off('warning', onWarning));
    const worker = await pipelineWorker(env, taskQueue, local.deps);
    const follow = new AbortController();

    // A round every 10 ms: hundreds of queries and descriptions, each with its own linked signal.
    const report = await worker.runUntil(
      processDocuments(env.client, config, local.blobs, [dir], {
        everyMs: 10,
        print: () => {},
        signal: follow.signal,
      }),
    );
    await sleep(50);

    assert.equal(report.tally?.done, 12);
    assert.deepEqual(
      warnings.map((w) => `${w.name}: ${w.message}`),
      [],
    );
    const stopped = new AbortController();
    stopped.abort(new Error('stopped before it began'));
    await assert.rejects(
      processDocuments(env.client, config, local.blobs, [dir], { print: () => {}, signal: stopped.signal }),
      /stopped before it began/,
    );
  });

  it('is one batch when the same documents are submitted twice at once', async () => {
    const { local, taskQueue, config } = await setup();
    const { dir, files } = folderOf(4);
    const worker = await pipelineWorker(env, taskQueue, local.deps);

    const [a, b] = await worker.runUntil(
      Promise.all([
        processDocuments(env.client, config, local.blobs, [dir], { everyMs: 200, print: () => {} }),
        processDocuments(env.client, config, local.blobs, [dir], { everyMs: 200, print: () => {} }),
      ]),
    );

    assert.equal(a.batchId, b.batchId);
    assert.equal(a.tally?.done, 4);
    await publishedOnce(local, files);
  });
});

describe('readBatchEntries', () => {
  /** A blob store in a scratch folder that notes each reference read. */
  function notedBlobs(): { blobs: BlobStore; read: string[] } {
    const inner = new FileBlobStore(scratchDir(defer, 'manifest-blobs-'));
    const read: string[] = [];
    const blobs: BlobStore = {
      where: inner.where,
      put: (bytes) => inner.put(bytes),
      get: (ref) => {
        read.push(ref);
        return inner.get(ref);
      },
      sweep: (before, keep) => inner.sweep(before, keep),
    };
    return { blobs, read };
  }
  const entries: BatchEntry[] = Array.from({ length: 10 }, (_, i) => ({
    documentId: `doc-${i}`,
    textRef: `sha256:${String(i).repeat(64).slice(0, 64)}`,
    title: `Document ${i}`,
    source: `doc-${i}.md`,
  }));

  it('reads and checks a manifest once, however many pages the batch asks for', async () => {
    const { blobs, read } = notedBlobs();
    const manifestRef = await blobs.put(Buffer.from(JSON.stringify({ entries })));
    const { readBatchEntries } = createBatchActivities({ blobs });
    const pages = [];
    for (let offset = 0; offset < entries.length; offset += 3)
      pages.push(...(await readBatchEntries({ manifestRef, offset, limit: 3 })));
    assert.deepEqual(pages, entries);
    assert.equal(read.length, 1);
  });

  it("reads a big batch's manifest page by page, across the pages' boundaries, each page once", async () => {
    const { blobs, read } = notedBlobs();
    const pageRefs: string[] = [];
    for (let i = 0; i < entries.length; i += 4)
      pageRefs.push(await blobs.put(Buffer.from(JSON.stringify({ entries: entries.slice(i, i + 4) }))));
    const manifestRef = await blobs.put(
      Buffer.from(JSON.stringify({ pages: pageRefs, pageSize: 4, total: entries.length })),
    );
    const { readBatchEntries } = createBatchActivities({ blobs });

    const got = [];
    for (let offset = 0; offset < entries.length; offset += 3)
      got.push(...(await readBatchEntries({ manifestRef, offset, limit: 3 })));
    assert.deepEqual(got, entries);
    assert.deepEqual(await readBatchEntries({ manifestRef, offset: 2, limit: 7 }), entries.slice(2, 9));
    assert.deepEqual(await readBatchEntries({ manifestRef, offset: 9, limit: 5 }), entries.slice(9));
    assert.deepEqual(read, [manifestRef, ...pageRefs]);

    // More pages than a worker keeps: the manifest, used at every read, stays kept while its pages go.
    const onePerPage: string[] = [];
    for (const entry of entries)
      onePerPage.push(await blobs.put(Buffer.from(JSON.stringify({ entries: [entry] }))));
    const longRef = await blobs.put(
      Buffer.from(JSON.stringify({ pages: onePerPage, pageSize: 1, total: entries.length })),
    );
    read.length = 0;
    const fresh = createBatchActivities({ blobs });
    for (let offset = 0; offset < entries.length; offset++)
      assert.deepEqual(await fresh.readBatchEntries({ manifestRef: longRef, offset, limit: 1 }), [
        entries[offset],
      ]);
    assert.deepEqual(read, [longRef, ...onePerPage]);

    // A page shorter than the manifest says ends the read there: the batch reports the manifest as short.
    const short = await blobs.put(
      Buffer.from(JSON.stringify({ pages: [pageRefs[0], pageRefs[2]], pageSize: 4, total: 8 })),
    );
    assert.deepEqual(await readBatchEntries({ manifestRef: short, offset: 3, limit: 5 }), [
      entries[3],
      ...entries.slice(8),
    ]);
  });
});

describe('held deliveries in a batch', () => {
  it(
    'ends with its own exit code once only held documents remain, naming them; they finish once settled',
    { timeout: 120_000 },
    async () => {
      const taskQueue = `batch-${randomUUID()}`;
      const { dir, files } = folderOf(3);
      const heldId = documentIdOf(files[1] ?? '');
      // A receiver that ignores keys and loses its answer to the second document's first POST (after applying it).
      const effects: string[] = [];
      const receiver = http.createServer((req, res) => {
        const chunks: Buffer[] = [];
        req.on('data', (c: Buffer) => chunks.push(c));
        req.on('end', () => {
          const { documentId } = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { documentId: string };
          effects.push(documentId);
          if (documentId === heldId && effects.filter((d) => d === heldId).length === 1)
            return void req.socket.destroy();
          res.writeHead(201, { 'content-type': 'application/json' }).end('{"revision": 1}');
        });
      });
      const origin = await listenOnLoopback(receiver);
      defer(() => closeServer(receiver));
      const ledger = scratchLedger(defer);
      const publisher = webhookPublisher(defer, `${origin}/publications`, {
        ledger,
        policy: 'hold',
        timeoutMs: 1_000,
      });
      const local = await tempParts(defer, { publisher });
      const lines: string[] = [];

      const report = await (
        await pipelineWorker(env, taskQueue, local.deps)
      ).runUntil(
        processDocuments(
          env.client,
          loadConfig({ DATA_DIR: local.dir, TEMPORAL_TASK_QUEUE: taskQueue }),
          local.blobs,
          [dir],
          {
            everyMs: 200,
            print: (line) => lines.push(line),
          },
        ),
      );

      assert.equal(report.exitCode, 4, lines.join('\n'));
      const [key] = (await ledger.openClaims()).map((e) => e.idempotencyKey);
      assert.ok(key !== undefined, 'no open claim');
      assert.ok(
        lines.some((l) =>
          l.startsWith(`HELD ${files[1]}: npm run deliveries -- resolve ${key} delivered --revision N`),
        ),
        lines.join('\n'),
      );
      assert.match(
        lines.join('\n'),
        /2 of 3 document\(s\) published, 1 held for a verdict on their delivery, 0 failed/,
      );
      const run = env.client.workflow.getHandle(workflowIdFor(heldId));
      assert.equal((await run.describe()).status.name, 'RUNNING');

      // The operator checked the receiver: it has it.
      assert.equal(
        await ledger.resolve(await openClaimOf(ledger, key), {
          delivered: { documentId: heldId, revision: 1, duplicate: true },
        }),
        true,
      );
      await run.signal(deliverySettledSignal);
      const result = await (await pipelineWorker(env, taskQueue, local.deps)).runUntil(run.result());
      assert.equal(result.publication.duplicate, true);
      assert.equal(effects.filter((d) => d === heldId).length, 1, 'the held delivery was posted again');
    },
  );
});
