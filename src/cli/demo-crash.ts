import './compose';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig, dataPaths, SAMPLES_DIR } from '../config';
import type { PipelineResult } from '../contract';
import { FileBlobStore } from '../documents/blobs';
import { collectDocuments } from '../documents/files';
import { runMain } from '../lib/run-main';
import { SqlitePublicationStore } from '../publisher/publication-store';
import { startReceiver } from '../publisher/receiver';
import { submitDocument } from '../runs/submit';
import type { Submission } from '../runs/submit';
import { connectClient } from '../temporal/connection';
import { startEmbeddedServer } from '../temporal/embedded-server';
import { freeLoopbackPort } from '../lib/loopback';
import { readyForCrash, waitForKill } from '../../demo/crash-point';
import { reportRecovery } from '../../demo/crash-report';
import { startLink } from '../../demo/link';
import { demoModel, startModelServer } from '../../demo/model-server';
import { say } from '../../demo/say';
import { startWorkerProcess } from '../../demo/worker-process';
import type { WorkerProcess } from '../../demo/worker-process';

/** The demo's model server answers each call this long after it arrived. */
const MODEL_LATENCY_MS = 1_000;
/** The model name the workers send; the demo's model server answers to any. */
const MODEL_NAME = 'demo-model';
/** With --manual, how long the demo waits for you to kill worker 1 before it does so itself. */
const MANUAL_WINDOW_S = 45;

/**
 * `npm run demo:crash [-- --manual]`: watch a crash and the recovery. Starts its own dev server, a model server, a
 * publish target and a real worker process, and submits the shipped samples. The crash is set up the same way every
 * time: the first document is published, but the publish target's answer is held back from worker 1; the other
 * documents have their summary and wait inside their tag call. Then worker 1 is SIGKILLed (with --manual, by you,
 * from another terminal), a new worker starts, and the demo shows per document which steps were replayed from the
 * history and which were rerun, counts the model calls the model server received per idempotency key, and the
 * publications. Everything lives in a temp folder and is removed at the end.
 */
async function run(): Promise<void> {
  const manual = process.argv.slice(2).includes('--manual');
  const began = Date.now();
  const at = (ms = Date.now()): string => `+${((ms - began) / 1000).toFixed(1)} s`;
  const config = loadConfig();
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pipeline-crash-demo-'));
  // The demo's own server on free ports with its database in the throwaway folder: the project's embedded server.
  const serverConfig = loadConfig({
    ...process.env,
    TEMPORAL_ADDRESS: '',
    DATA_DIR: dataDir,
    EMBEDDED_TEMPORAL_PORT: String(await freeLoopbackPort()),
    TEMPORAL_UI_PORT: String(await freeLoopbackPort()),
    PAYLOAD_ENCRYPTION_KEY: '',
    PAYLOAD_DECRYPTION_KEYS: '',
    PAYLOAD_REQUIRE_ENCRYPTION: '',
  });
  const store = new SqlitePublicationStore(path.join(dataDir, 'publish-target', 'publications.db'));
  const cleanups: (() => Promise<void>)[] = [];
  const workers: WorkerProcess[] = [];
  try {
    say('Starting a throwaway Temporal dev server, a model server, a publish target and worker 1...');
    const server = await startEmbeddedServer(serverConfig);
    cleanups.push(() => server.stop());
    const address = `127.0.0.1:${serverConfig.embeddedPort}`;
    const { client, close } = await connectClient(serverConfig, {
      endpoint: { address, namespace: 'default', secure: {} },
    });
    cleanups.push(close);
    const { documents } = collectDocuments([SAMPLES_DIR], config.maxDocumentBytes);
    documents.sort((a, b) => a.source.localeCompare(b.source));
    const [firstDocument] = documents;
    if (firstDocument === undefined) throw new Error(`no documents in ${SAMPLES_DIR}`);
    const runs: Submission[] = [];
    let crashed = false;
    const firstRun = (key: string | undefined): boolean =>
      runs[0] !== undefined && key?.startsWith(`${runs[0].runId}:`) === true;

    const receiver = await startReceiver(store);
    cleanups.push(() => receiver.close());
    // The first document's publication is committed at the target, but worker 1 never hears back.
    const link = await startLink(receiver.url, { holdReply: (request) => !crashed && firstRun(request.key) });
    cleanups.push(() => link.close());
    // The other documents' tag calls are held open until worker 1 is gone: the crash cuts them off.
    const answer = demoModel(MODEL_LATENCY_MS);
    const model = await startModelServer((request, n) =>
      request.step === 'tag' && !crashed && !firstRun(request.idempotencyKey) ? 'hang' : answer(request, n),
    );
    cleanups.push(() => model.close());
    const taskQueue = 'crash-demo';
    const workerEnv: NodeJS.ProcessEnv = {
      ...process.env,
      TEMPORAL_ADDRESS: address,
      TEMPORAL_NAMESPACE: 'default',
      TEMPORAL_TASK_QUEUE: taskQueue,
      DATA_DIR: dataDir,
      // The demo's own model server, whatever the shell says: the demo needs no account and no network, and it
      // counts every call the workers make.
      OPENAI_BASE_URL: model.baseUrl,
      OPENAI_MODEL: MODEL_NAME,
      // Whatever the shell sets: the demo's model is the stand-in above.
      MODEL: '',
      OPENAI_API_KEY: '',
      MODEL_REQUEST_TIMEOUT_MS: '',
      PUBLISH_WEBHOOK_URL: link.url,
      // Longer than the kill window: worker 1 keeps waiting for the held answer until it is killed.
      PUBLISH_REQUEST_TIMEOUT_MS: String((MANUAL_WINDOW_S + 10) * 1000),
      PUBLISH_WEBHOOK_SECRET: '',
      // The publish target dedupes by Idempotency-Key: a retry after the crash may send again.
      OPEN_DELIVERY_POLICY: 'resend',
      // A dead worker's claim on its model answer lapses soon, so the retry does not wait long to take it over.
      MEMO_LEASE_SECONDS: '5',
      // The demo's own stores in its throwaway folder, whatever the shell says: it counts the memo rows there.
      DATABASE_URL: '',
      // Plain payloads, whatever the shell says: the demo's client and its history reading use no codec.
      PAYLOAD_ENCRYPTION_KEY: '',
      PAYLOAD_ENCRYPTION_KEY_ID: '',
      PAYLOAD_DECRYPTION_KEYS: '',
      PAYLOAD_REQUIRE_ENCRYPTION: '',
      DOCUMENT_ID_SECRET: '',
      // The demo's local server, not a cluster from the shell's envconfig profile (no TLS, no API key).
      TEMPORAL_API_KEY: '',
      TEMPORAL_TLS: '',
      TEMPORAL_PROFILE: '',
      TEMPORAL_CONFIG_FILE: '',
    };
    const first = await startWorkerProcess(workerEnv);
    workers.push(first);
    say(
      `${at()} Worker 1 is pid ${first.child.pid}. The model answers each call after ${MODEL_LATENCY_MS / 1000} s, ` +
        `but holds the tag calls of documents 2 to ${documents.length} until worker 1 is gone; the publish ` +
        'target commits at once, but never answers worker 1.',
    );

    const blobs = new FileBlobStore(dataPaths(dataDir).blobs);
    for (const document of documents) {
      const submission = await submitDocument(client, blobs, taskQueue, document);
      runs.push(submission);
      say(`${at()} Submitted "${document.title}" as ${submission.workflowId}`);
    }

    const done = await readyForCrash(runs, store, model);
    say(
      `${at()} Ready: "${firstDocument.title}" is published, but worker 1 has not heard back; ` +
        `${runs.length - 1} documents wait inside their tag call; ${done} steps are recorded as done.`,
    );
    const pid = first.child.pid ?? 0;
    if (manual) {
      say(`Kill worker 1 as a crash would, from another terminal:  kill -9 ${pid}`);
      say(`(or press Enter here; after ${MANUAL_WINDOW_S} s the demo sends it itself)`);
      await waitForKill(first, MANUAL_WINDOW_S * 1000);
    } else {
      await first.kill();
    }
    const how = await first.exited;
    crashed = true;
    say(
      `${at()} Worker 1 is gone (${how}). Starting worker 2: Temporal retries the dead worker's steps once their ` +
        'heartbeat timeout (10 s) has passed, under the same idempotency keys; finished steps are replayed from ' +
        'the history, not run again.',
    );
    const second = await startWorkerProcess(workerEnv);
    workers.push(second);
    say(`${at()} Worker 2 is pid ${second.child.pid}.`);

    for (const r of runs) {
      const result: PipelineResult = await r.handle.result();
      const receipt =
        result.publication?.duplicate === true ? ', a retry answered with the first receipt' : '';
      say(
        `${at()} "${r.document.title}" done: published as revision ${result.publication?.revision}${receipt}`,
      );
    }

    if (!(await reportRecovery({ runs, workers, killed: first, model, store, dataDir, at })))
      process.exitCode = 1;
    say(`Done in ${at().slice(1)}.`);
  } finally {
    for (const worker of workers) await worker.kill();
    for (const cleanup of cleanups.reverse()) await cleanup();
    await store.close();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}

runMain(run);
