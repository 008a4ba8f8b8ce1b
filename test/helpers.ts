/**
 * Shared parts for tests: real-but-local dependencies (SQLite files in a temp folder, an OpenAI-compatible HTTP
 * server on loopback), the Temporal binaries, one workflow bundle per test process. What they make is closed and
 * removed after a file's tests by test/scratch.ts's cleanup registry.
 */
import '../src/cli/compose';
import { registerReviewSearchAttribute } from '../src/temporal/search-attributes';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import assert from 'node:assert/strict';
import { ActivityFailure, ApplicationFailure } from '@temporalio/common';
import { WorkflowFailedError } from '@temporalio/client';
import type { temporal } from '@temporalio/proto';
import { bundleWorkflowCode, DefaultLogger, Runtime } from '@temporalio/worker';
import type { Worker, WorkflowBundle } from '@temporalio/worker';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import type { EphemeralServerExecutable } from '@temporalio/testing';
import type { ActivityDependencies } from '../src/steps/activities';
import type { SqlRateLimits } from '../src/model/rate-limit-store';
import { completion, startModelServer } from '../demo/model-server';
import type { ChatReply, ChatRequest, ChatScript, ModelServer } from '../demo/model-server';
import { startWorkerProcess } from '../demo/worker-process';
import type { WorkerProcess } from '../demo/worker-process';
import { loadConfig } from '../src/config';
import { prebuiltBundle } from '../src/temporal/bundle';
import { startLocalDevServer } from '../src/temporal/local-server';
import { INPUT_SCHEMA_VERSION, PipelineOptionsSchema } from '../src/contract';
import type { PipelineInput, PipelineOptions } from '../src/contract';
import type { PipelineResult } from '../src/cli/compose';
import { createDependencies } from '../src/dependencies';
import type { BlobStore } from '../src/documents/blobs';
import { relay } from '../demo/link';
import { closeServer, listenOnLoopback, readBody } from '../src/lib/loopback';
import type { AnswerMemo } from '../src/model/memo';
import { OfflineModel } from '../src/model/offline-model';
import { AiSdkModel } from '../src/model/ai-sdk';
import { remoteModel } from '../src/model/choose';
import { openaiCompatible } from '../src/model/provider-openai-compatible';
import type { DocumentModel } from '../src/model/types';
import type { PublicationStore } from '../src/publisher/publication-store';
import { SqlDeliveryLedger, SqliteDeliveryLedger } from '../src/publisher/ledger-store';
import type { DeliveryLedger, LedgerEntry } from '../src/publisher/ledger';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import { freshSchema } from './postgres';
import { WebhookPublisher } from '../src/publisher/webhook-publisher';
import type { Publisher } from '../src/publisher/types';
import type { WorkflowHandleWithFirstExecutionRunId } from '@temporalio/client';
import type { documentPipeline } from '../workflows';
import { resolveTemporalExecutable } from '../src/temporal/binaries';
import { createPipelineWorker } from '../src/temporal/worker';
import type { PipelineWorkerOptions } from '../src/temporal/worker';
import { freePort, scratchDir, tempDir } from './scratch';
import type { Defer } from './scratch';

/** A started run of this repository's pipeline, its result typed by the step list. */
export type StartedPipeline = WorkflowHandleWithFirstExecutionRunId<typeof documentPipeline>;

// ---------------------------------------------------------------------------------------------------------------
// Temporal: binaries, workflow bundle, runtime, test environment, workers and runs
// ---------------------------------------------------------------------------------------------------------------

/** The Temporal CLI (dev server) or the time-skipping test server: env variable, PATH, else SDK download. */
export function temporalExecutable(binary: 'cli' | 'test-server'): EphemeralServerExecutable {
  return resolveTemporalExecutable(binary, loadConfig());
}

let bundle: Promise<WorkflowBundle> | undefined;
/**
 * The workflow code for every worker of a test file: `npm run bundle`'s file while it is newer than every source
 * (npm test makes it first, so files do not each spend ~2 s of CPU bundling the same code), else bundled here.
 */
export function workflowBundle(): Promise<WorkflowBundle> {
  bundle ??= loadBundle();
  return bundle;
}

async function loadBundle(): Promise<WorkflowBundle> {
  const prebuilt = prebuiltBundle(require.resolve('../workflows'));
  if (prebuilt !== undefined) return { code: await fs.promises.readFile(prebuilt.codePath, 'utf8') };
  return bundleWorkflowCode({ workflowsPath: require.resolve('../workflows'), logger: silentLogger });
}

const noop = (): void => {};
/** A logger that drops everything (for the bundler, whose progress lines are noise in test output). */
export const silentLogger = { trace: noop, debug: noop, info: noop, warn: noop, error: noop, log: noop };

/**
 * Installs this process's Temporal Runtime with `logger` (errors only unless given another) and the native core's
 * logs filtered to errors too, and returns the logger. For files whose tests fail activities and workflows on
 * purpose: the SDK logs each such failure as a warning. (node runs each test file in its own process, and a
 * process installs its Runtime once.)
 */
export function installQuietRuntime(logger = new DefaultLogger('ERROR')): DefaultLogger {
  Runtime.install({
    logger,
    telemetryOptions: { logging: { filter: { core: 'ERROR', other: 'ERROR' }, forward: {} } },
  });
  return logger;
}

/**
 * A dev server for a test file, with what every server the project starts is told (src/temporal/tuning.ts): for
 * tests that wait in real time. The caller tears it down.
 */
export function devServerEnv(): Promise<TestWorkflowEnvironment> {
  return startLocalDevServer(loadConfig());
}

/**
 * A time-skipping test server for this file, torn down after its tests (after everything deferred later, so
 * call it first, in `before`). The workflow bundle is built before it returns, so no test pays for that.
 */
export async function timeSkippingEnv(defer: Defer): Promise<TestWorkflowEnvironment> {
  const env = await TestWorkflowEnvironment.createTimeSkipping({
    server: { executable: temporalExecutable('test-server') },
  });
  defer(() => env.teardown());
  // The review's search attribute: the dev servers are told it at start, the test server is told it here.
  await registerReviewSearchAttribute(env.connection, env.namespace ?? 'default');
  await workflowBundle();
  return env;
}

/** A worker on `env` for `taskQueue`, made as production makes it, with the bundled workflow code over `deps`. */
export async function pipelineWorker(
  env: TestWorkflowEnvironment,
  taskQueue: string,
  deps: ActivityDependencies,
  options: Pick<PipelineWorkerOptions, 'dataConverter' | 'phases'> = {},
): Promise<Worker> {
  return createPipelineWorker({
    connection: env.nativeConnection,
    namespace: env.namespace ?? 'default',
    taskQueue,
    deps,
    workflowBundle: await workflowBundle(),
    ...options,
  });
}

/** Starts the pipeline with `input` (valid or not) on `taskQueue`, under a fresh workflow ID `wf-<uuid>`. */
export function startPipeline(
  env: TestWorkflowEnvironment,
  taskQueue: string,
  input: unknown,
): Promise<StartedPipeline> {
  return env.client.workflow.start<typeof documentPipeline>('documentPipeline', {
    taskQueue,
    workflowId: `wf-${randomUUID()}`,
    args: [input],
  });
}

/**
 * Starts the pipeline with `input` on a fresh task queue (`<taskQueuePrefix><uuid>`), runs a worker over `local`
 * until `use` is done with the handle, and returns what `use` returned.
 */
export async function withPipeline<T>(
  env: TestWorkflowEnvironment,
  local: LocalParts,
  input: unknown,
  use: (handle: StartedPipeline) => Promise<T>,
  { taskQueuePrefix = 'test-' }: { taskQueuePrefix?: string } = {},
): Promise<T> {
  const taskQueue = `${taskQueuePrefix}${randomUUID()}`;
  const worker = await pipelineWorker(env, taskQueue, local.deps);
  const handle = await startPipeline(env, taskQueue, input);
  return worker.runUntil(use(handle));
}

/** Waits for a run to finish and returns its result, its (first) run ID and its history. */
export async function finishedRun(
  handle: StartedPipeline,
): Promise<{ result: PipelineResult; runId: string; history: temporal.api.history.v1.IHistory }> {
  return {
    result: await handle.result(),
    runId: handle.firstExecutionRunId,
    history: await handle.fetchHistory(),
  };
}

/**
 * For `assert.rejects`: asserts the error chain WorkflowFailedError -> ActivityFailure (of `activityId`) ->
 * ApplicationFailure (a failed step), then hands both failures to `check`.
 */
export function stepFailure(
  activityId: string,
  check: (failure: ApplicationFailure, activity: ActivityFailure) => void,
): (err: unknown) => boolean {
  return (err) => {
    assert.ok(err instanceof WorkflowFailedError, `expected WorkflowFailedError, got ${String(err)}`);
    assert.ok(err.cause instanceof ActivityFailure, `expected ActivityFailure, got ${String(err.cause)}`);
    assert.equal(err.cause.activityId, activityId);
    assert.ok(
      err.cause.cause instanceof ApplicationFailure,
      `expected ApplicationFailure, got ${String(err.cause.cause)}`,
    );
    check(err.cause.cause, err.cause);
    return true;
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Local parts: blob store, memo and publication database in a temp folder
// ---------------------------------------------------------------------------------------------------------------

export interface LocalParts {
  dir: string;
  /** The pacing of provider calls and the budgets, in the data folder's memo file. */
  rateLimits: SqlRateLimits;
  blobs: BlobStore;
  memo: AnswerMemo;
  store: PublicationStore;
  deps: ActivityDependencies;
  close(): Promise<void>;
}

export interface LocalPartsOptions {
  dir?: string;
  /** The model; `configured`: the one `env` configures, built as a worker builds it (paced, within budgets). */
  model?: DocumentModel | 'configured';
  publisher?: Publisher;
  maxDocumentBytes?: number;
  /** Extra environment for loadConfig, e.g. DATABASE_URL for the PostgreSQL backend. */
  env?: Record<string, string>;
}

/**
 * The production wiring (createDependencies) over a temp data folder: blob store, memo and publication database
 * as `npm run worker` has them, with the offline model unless given another.
 */
export async function localParts({
  dir = tempDir(),
  model = new OfflineModel(),
  publisher,
  maxDocumentBytes = 1_000_000,
  env = {},
}: LocalPartsOptions = {}): Promise<LocalParts> {
  const config = loadConfig({ DATA_DIR: dir, MAX_DOCUMENT_BYTES: String(maxDocumentBytes), ...env });
  const parts = await createDependencies(config, {
    ...(model === 'configured' ? {} : { model }),
    ...(publisher !== undefined ? { publisher } : {}),
  });
  return {
    dir,
    rateLimits: parts.stores.rateLimits,
    blobs: parts.stores.blobs,
    memo: parts.stores.memo,
    // With a publisher of its own, the test still gets the built-in target to look into.
    store: parts.stores.publications(),
    deps: parts.deps,
    close: () => parts.close(),
  };
}

/**
 * A webhook publisher to `url` with a delivery ledger of its own in a scratch folder, as a worker without
 * DATABASE_URL has; `policy` is OPEN_DELIVERY_POLICY, `secret` PUBLISH_WEBHOOK_SECRET (unsigned when unset).
 */
export function webhookPublisher(
  defer: Defer,
  url: string,
  {
    timeoutMs = 5_000,
    policy = 'auto',
    ledger = scratchLedger(defer),
    secret,
    lookupUrl,
  }: {
    timeoutMs?: number;
    policy?: 'auto' | 'resend' | 'hold';
    ledger?: DeliveryLedger;
    secret?: string;
    lookupUrl?: string;
  } = {},
): WebhookPublisher {
  return new WebhookPublisher({ url, timeoutMs, ledger, openClaimPolicy: policy, secret, lookupUrl });
}

/**
 * Passes one POST on to `targetUrl` with its Idempotency-Key, and the answer back with the target's echo of the
 * key; with `dropReply`, drops the connection instead of answering, as a reply lost after the effect.
 */
export async function forwardPost(
  targetUrl: string,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  { dropReply = false }: { dropReply?: boolean } = {},
): Promise<void> {
  const header = req.headers['idempotency-key'];
  const answer = await relay(targetUrl, {
    key: typeof header === 'string' ? header : undefined,
    body: await readBody(req),
  });
  if (dropReply) return void res.socket?.destroy();
  const echo: Record<string, string> =
    answer.echoedKey === null ? {} : { 'idempotency-key': answer.echoedKey };
  res.writeHead(answer.status, { 'content-type': 'application/json', ...echo }).end(answer.body);
}

/** A delivery ledger in a scratch folder, closed after the file's tests. */
export function scratchLedger(defer: Defer): DeliveryLedger {
  const ledger = new SqliteDeliveryLedger(path.join(scratchDir(defer, 'ledger-'), 'ledger.db'));
  defer(() => ledger.close());
  return ledger;
}

/** A delivery ledger on each backend, fresh for each call of `ledger`, closed after the file's tests. */
export function ledgerBackends(defer: Defer): { name: string; ledger(): Promise<DeliveryLedger> }[] {
  return [
    { name: 'SQLite', ledger: () => Promise.resolve(scratchLedger(defer)) },
    {
      name: 'PostgreSQL',
      async ledger() {
        const pool = await openPostgres(await freshSchema(defer));
        defer(() => pool.end());
        return new SqlDeliveryLedger(postgresSql(pool));
      },
    },
  ];
}

/** The key a receiver's lookup GET asks about: `/publications/<key>`, its query string aside. */
export function lookupKeyOf(req: http.IncomingMessage): string {
  return decodeURIComponent(/^\/publications\/([^?]+)/.exec(req.url ?? '')?.[1] ?? '');
}

/**
 * Answers a receiver's lookup by key in the documented shape (docs/deploy.md, the lookup by key): 200 naming the
 * key, the revision and the version delivered under it; 404 naming the key, `found: false`, when nothing was.
 */
export function answerLookup(
  res: http.ServerResponse,
  key: string,
  delivered: { revision: number; textRef: string } | undefined,
): void {
  if (delivered === undefined) res.writeHead(404).end(JSON.stringify({ idempotencyKey: key, found: false }));
  else
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ idempotencyKey: key, ...delivered }));
}

/** The open claim under `key`, as an operator's listing shows it: what a verdict on it names. */
export async function openClaimOf(ledger: DeliveryLedger, key: string): Promise<LedgerEntry> {
  const entry = (await ledger.openClaims()).find((e) => e.idempotencyKey === key);
  assert.ok(entry !== undefined, `no open claim under ${key}`);
  return entry;
}

/** Local parts (see localParts), closed and their folder removed after the file's tests. */
export async function tempParts(defer: Defer, options: LocalPartsOptions = {}): Promise<LocalParts> {
  const created = await localParts(options);
  defer(async () => {
    await created.close();
    fs.rmSync(created.dir, { recursive: true, force: true });
  });
  return created;
}

/** A valid workflow input for `text`, stored in `blobs`, with a unique document ID unless one is given. */
export async function pipelineInput(
  blobs: BlobStore,
  text: string,
  {
    documentId = `doc-${randomUUID()}`,
    options = {},
  }: { documentId?: string; options?: Partial<PipelineOptions> } = {},
): Promise<PipelineInput> {
  // Complete, as the project's clients send it (options a test wants refused go as they are).
  const complete = PipelineOptionsSchema.safeParse(options);
  return {
    schemaVersion: INPUT_SCHEMA_VERSION,
    documentId,
    textRef: await blobs.put(Buffer.from(text, 'utf8')),
    title: `Test document ${documentId}`,
    options: complete.success ? complete.data : options,
  };
}

export const SAMPLE_TEXT = [
  '# Checkpoints',
  '',
  'Long jobs fail partway through. A checkpoint records each finished step so that a restart skips it.',
  'Idempotency keys make the unfinished step safe to run twice. Temporal keeps the checkpoint in its event history.',
  'Workers can crash at any moment, and the history still says which steps completed.',
].join('\n');

// ---------------------------------------------------------------------------------------------------------------
// The demo's model server (demo/model-server.ts), scripted per test, and the model client for it
// ---------------------------------------------------------------------------------------------------------------

/** A scripted model server, closed after the file's tests. */
export async function modelServerFor(defer: Defer, script: ChatScript): Promise<ModelServer> {
  const server = await startModelServer(script);
  defer(() => server.close());
  return server;
}

/**
 * The OpenAI-compatible model client for a loopback server: model `test-model`, API key `test-key` and a 5 s
 * request timeout unless given others. `apiKey: undefined` sends no Authorization header.
 */
export function openAIModel(
  server: { baseUrl: string },
  options: { model?: string; apiKey?: string | undefined; requestTimeoutMs?: number } = {},
): AiSdkModel {
  return new AiSdkModel(
    remoteModel(openaiCompatible, {
      baseUrl: server.baseUrl,
      model: options.model ?? 'test-model',
      apiKey: 'apiKey' in options ? options.apiKey : 'test-key',
    }),
    options.requestTimeoutMs ?? 5_000,
  );
}

/** True for a tag step's request: its x-pipeline-step header (ChatRequest.step), which the pipeline always sends. */
export function isTagRequest(request: ChatRequest): boolean {
  return request.step === 'tag';
}

/** The summary normalAnswer gives. */
export const SUMMARY = 'Checkpoints let restarts skip finished steps.';
/** The tags answer normalAnswer gives: valid JSON tags, as the model's text. */
export const TAGS = '{"tags": ["checkpoints", "idempotency"]}';

/** A model server script that answers summarize requests with `summary` and tag requests with `tags`. */
export function answering(summary: string, tags: string): (request: ChatRequest) => ChatReply {
  return (request) => ({ body: completion(isTagRequest(request) ? tags : summary) });
}

/** Answers tag requests with valid JSON tags (TAGS) and summarize requests with a one-line summary (SUMMARY). */
export const normalAnswer = answering(SUMMARY, TAGS);

// ---------------------------------------------------------------------------------------------------------------
// Worker processes, for crash tests
// ---------------------------------------------------------------------------------------------------------------

/** Writes the workflow bundle to a file once, so each restarted worker process skips bundling. */
export async function writeWorkflowBundle(dir: string): Promise<string> {
  const file = path.join(dir, 'workflow-bundle.js');
  fs.writeFileSync(file, (await workflowBundle()).code);
  return file;
}

/**
 * What a crash worker must not take from the shell that runs the tests: its publish target, kill switches and
 * payload keys; each test sets the ones it means on top.
 */
export const CRASH_WORKER_DEFAULTS: Readonly<Record<string, string>> = {
  PUBLISH_WEBHOOK_URL: '',
  CRASH_AFTER_PUBLISH: '',
  CRASH_AFTER_MEMO_WRITE: '',
  // The tests' clients read plain payloads.
  PAYLOAD_ENCRYPTION_KEY: '',
  PAYLOAD_DECRYPTION_KEYS: '',
  PAYLOAD_REQUIRE_ENCRYPTION: '',
};

/**
 * Starts test/fixtures/worker-process.ts (the real worker wiring plus crash hooks) with `env` on top of this
 * process's environment, and waits until it polls.
 */
export function startCrashableWorker(
  env: Record<string, string>,
  readyTimeoutMs = 60_000,
): Promise<WorkerProcess> {
  return startWorkerProcess(
    { ...process.env, ...env },
    { script: path.join(__dirname, 'fixtures', 'worker-process.ts'), readyTimeoutMs },
  );
}

export { closeServer, listenOnLoopback };
export { completion, startModelServer } from '../demo/model-server';
export type { ChatReply, ChatRequest, ChatScript, ModelServer };

/** Asserts an ApplicationFailure thrown by an activity: its type, whether Temporal may retry it, its message. */
export function applicationFailure(
  type: string,
  retryable: boolean,
  message: RegExp[],
  check: (failure: ApplicationFailure) => void = () => {},
): (err: unknown) => boolean {
  return (err) => {
    assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
    assert.equal(err.type, type, err.message);
    assert.equal(err.nonRetryable, !retryable, err.message);
    for (const pattern of message) assert.match(err.message, pattern);
    check(err);
    return true;
  };
}

/** Waits, polling every 20 ms, until `condition` holds; fails naming `what` after `timeoutMs`. */
export async function until(condition: () => boolean, what: string, timeoutMs = 3_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** The workflows bundled with `@temporalio/workflow` swapped for a fixture (a patch answered one way, say). */
export function workflowsWithWorkflowModule(fixture: string): Promise<WorkflowBundle> {
  return bundleWorkflowCode({
    workflowsPath: require.resolve('../workflows'),
    logger: silentLogger,
    webpackConfigHook: (config) => ({
      ...config,
      resolve: {
        ...config.resolve,
        alias: { ...config.resolve?.alias, '@temporalio/workflow$': fixture },
      },
    }),
  });
}

/** One document's spans under its `StartWorkflow:documentPipeline` root, as test/otlp-proto.ts renders a tree. */
export const DOCUMENT_SPANS_UNDER_START = [
  '  RunWorkflow:documentPipeline',
  '    StartActivity:summarize',
  '      RunActivity:summarize',
  '        model call',
  '    StartActivity:tag',
  '      RunActivity:tag',
  '        model call',
  '    StartActivity:publish',
  '      RunActivity:publish',
  '        publish POST',
].join('\n');

/** `npm run worker` on `env` with its metrics page on a free port, killed when the test ends. */
export async function startMetricsWorker(
  defer: Defer,
  env: TestWorkflowEnvironment,
  dataDir: string,
  taskQueue: string,
  extraEnv: NodeJS.ProcessEnv = {},
): Promise<{ worker: WorkerProcess; metricsPort: number }> {
  const metricsPort = await freePort();
  const worker = await startWorkerProcess({
    ...process.env,
    TEMPORAL_ADDRESS: env.address,
    TEMPORAL_NAMESPACE: env.namespace ?? 'default',
    TEMPORAL_TASK_QUEUE: taskQueue,
    DATA_DIR: dataDir,
    METRICS_PORT: String(metricsPort),
    LOG_LEVEL: 'warn',
    ...extraEnv,
  });
  defer(async () => void (await worker.kill()));
  return { worker, metricsPort };
}
