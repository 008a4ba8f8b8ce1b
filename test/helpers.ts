/**
 * Shared parts for tests: real-but-local dependencies (SQLite files in a temp folder, an OpenAI-compatible HTTP
 * server on loopback), the Temporal binaries, one workflow bundle per test process, and the cleanup registry
 * that closes and removes them after a file's tests.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { after } from 'node:test';
import assert from 'node:assert/strict';
import { ActivityFailure, ApplicationFailure } from '@temporalio/common';
import { WorkflowFailedError } from '@temporalio/client';
import type { WorkflowHandleWithFirstExecutionRunId } from '@temporalio/client';
import type { temporal } from '@temporalio/proto';
import { bundleWorkflowCode, DefaultLogger, Runtime, Worker } from '@temporalio/worker';
import type { WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import type { EphemeralServerExecutable } from '@temporalio/testing';
import { createActivities } from '../activities';
import { blobTextSource } from '../activities/document-text';
import type { ActivityDependencies } from '../activities';
import { resolveTemporalExecutable } from '../src/binaries';
import { BlobStore } from '../src/blobs';
import { AnswerMemo } from '../src/model/memo';
import { OfflineModel } from '../src/model/offline-model';
import { OpenAICompatibleModel } from '../src/model/openai-compatible';
import type { DocumentModel } from '../src/model/types';
import { PublicationStore } from '../src/publisher/publication-store';
import { SqlitePublisher } from '../src/publisher/sqlite-publisher';
import type { Publisher } from '../src/publisher/types';
import { INPUT_SCHEMA_VERSION } from '../src/shared';
import type { PipelineInput, PipelineOptions, PipelineResult } from '../src/shared';
import type { documentPipeline } from '../workflows';

// ---------------------------------------------------------------------------------------------------------------
// Cleanup after a file's tests
// ---------------------------------------------------------------------------------------------------------------

/** Closes or removes something a test made. */
export type Cleanup = () => Promise<void> | void;
/** Registers a cleanup to run after the file's tests. */
export type Defer = (cleanup: Cleanup) => void;

/**
 * A cleanup registry for this test file: returns `defer(cleanup)`, and runs what was deferred in node:test's
 * `after` hook, last registered first (a folder is removed after the store inside it is closed). Call once, at
 * the top level of the file.
 */
export function cleanupAfterAll(): Defer {
  const cleanups: Cleanup[] = [];
  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup();
  });
  return (cleanup) => {
    cleanups.push(cleanup);
  };
}

/** A fresh, empty temp folder, removed after the file's tests. */
export function scratchDir(defer: Defer, prefix?: string): string {
  const dir = tempDir(prefix);
  defer(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

// ---------------------------------------------------------------------------------------------------------------
// Temporal: binaries, workflow bundle, runtime, test environment, workers and runs
// ---------------------------------------------------------------------------------------------------------------

/** The Temporal CLI (dev server) or the time-skipping test server: env variable, PATH, else SDK download. */
export function temporalExecutable(binary: 'cli' | 'test-server'): EphemeralServerExecutable {
  const explicit = binary === 'cli' ? process.env.TEMPORAL_CLI_PATH : process.env.TEMPORAL_TEST_SERVER_PATH;
  return resolveTemporalExecutable(binary, explicit === '' ? undefined : explicit);
}

let bundle: Promise<WorkflowBundleWithSourceMap> | undefined;
/** The workflow code, bundled once per test file and reused by every worker in it. */
export function workflowBundle(): Promise<WorkflowBundleWithSourceMap> {
  bundle ??= bundleWorkflowCode({ workflowsPath: require.resolve('../workflows'), logger: silentLogger });
  return bundle;
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
 * A time-skipping test server for this file, torn down after its tests (after everything deferred later, so
 * call it first, in `before`). The workflow bundle is built before it returns, so no test pays for that.
 */
export async function timeSkippingEnv(defer: Defer): Promise<TestWorkflowEnvironment> {
  const env = await TestWorkflowEnvironment.createTimeSkipping({
    server: { executable: temporalExecutable('test-server') },
  });
  defer(() => env.teardown());
  await workflowBundle();
  return env;
}

/** A handle on one run of the document pipeline. */
export type PipelineHandle = WorkflowHandleWithFirstExecutionRunId<typeof documentPipeline>;

/** A worker on `env` for `taskQueue`: the bundled workflow code and the real activities over `deps`. */
export async function pipelineWorker(
  env: TestWorkflowEnvironment,
  taskQueue: string,
  deps: ActivityDependencies,
): Promise<Worker> {
  return Worker.create({
    connection: env.nativeConnection,
    taskQueue,
    workflowBundle: await workflowBundle(),
    activities: createActivities(deps),
  });
}

/** Starts the pipeline with `input` (valid or not) on `taskQueue`, under a fresh workflow ID `wf-<uuid>`. */
export function startPipeline(
  env: TestWorkflowEnvironment,
  taskQueue: string,
  input: unknown,
): Promise<PipelineHandle> {
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
  use: (handle: PipelineHandle) => Promise<T>,
  { taskQueuePrefix = 'test-' }: { taskQueuePrefix?: string } = {},
): Promise<T> {
  const taskQueue = `${taskQueuePrefix}${randomUUID()}`;
  const worker = await pipelineWorker(env, taskQueue, local.deps);
  const handle = await startPipeline(env, taskQueue, input);
  return worker.runUntil(use(handle));
}

/** Waits for a run to finish and returns its result, its (first) run ID and its history. */
export async function finishedRun(
  handle: PipelineHandle,
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

/** A fresh temp folder, removed by the caller's `cleanup`. */
export function tempDir(prefix = 'pipeline-test-'): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export interface LocalParts {
  dir: string;
  blobs: BlobStore;
  memo: AnswerMemo;
  store: PublicationStore;
  deps: ActivityDependencies;
  close(): void;
}

export interface LocalPartsOptions {
  dir?: string;
  model?: DocumentModel;
  publisher?: Publisher;
  maxDocumentBytes?: number;
}

/** Real activity dependencies in a temp folder: blob store, memo and publication database as in production. */
export function localParts({
  dir = tempDir(),
  model = new OfflineModel(),
  publisher,
  maxDocumentBytes = 1_000_000,
}: LocalPartsOptions = {}): LocalParts {
  const blobs = new BlobStore(path.join(dir, 'blobs'));
  const memo = new AnswerMemo(path.join(dir, 'memo.db'));
  const store = new PublicationStore(path.join(dir, 'publications.db'));
  return {
    dir,
    blobs,
    memo,
    store,
    deps: {
      model,
      memo,
      publisher: publisher ?? new SqlitePublisher(store),
      texts: blobTextSource(blobs, maxDocumentBytes),
    },
    close() {
      memo.close();
      store.close();
    },
  };
}

/** Local parts (see localParts), closed and their folder removed after the file's tests. */
export function tempParts(defer: Defer, options: LocalPartsOptions = {}): LocalParts {
  const created = localParts(options);
  defer(() => {
    created.close();
    fs.rmSync(created.dir, { recursive: true, force: true });
  });
  return created;
}

/** A valid workflow input for `text`, stored in `blobs`, with a unique document ID unless one is given. */
export function pipelineInput(
  blobs: BlobStore,
  text: string,
  {
    documentId = `doc-${randomUUID()}`,
    options = {},
  }: { documentId?: string; options?: Partial<PipelineOptions> } = {},
): PipelineInput {
  return {
    schemaVersion: INPUT_SCHEMA_VERSION,
    documentId,
    textRef: blobs.put(Buffer.from(text, 'utf8')),
    title: `Test document ${documentId}`,
    options,
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
// A scripted OpenAI-compatible model server on loopback, and the model client for it
// ---------------------------------------------------------------------------------------------------------------

export interface ChatRequest {
  idempotencyKey: string | undefined;
  authorization: string | undefined;
  body: unknown;
}

/** How the fake model answers one request: a status, headers and a body; or `hang` to never answer. */
export type ChatReply =
  | {
      status?: number;
      headers?: Record<string, string>;
      body: unknown;
      /** answer after this long */ delayMs?: number;
    }
  | 'hang';

export interface ModelServer {
  baseUrl: string;
  requests: ChatRequest[];
  close(): Promise<void>;
}

/** A chat-completions body with `content`, the way OpenAI-compatible servers answer. */
export function completion(content: string, usage = { prompt_tokens: 100, completion_tokens: 20 }): unknown {
  return { choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }], usage };
}

/** Reads a chat request's JSON body (undefined when it is not JSON) and the headers the tests look at. */
export function onChatRequest(req: http.IncomingMessage, handle: (request: ChatRequest) => void): void {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    let body: unknown;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      body = undefined;
    }
    const header = (name: string): string | undefined => {
      const value = req.headers[name];
      return typeof value === 'string' ? value : undefined;
    };
    handle({ idempotencyKey: header('idempotency-key'), authorization: header('authorization'), body });
  });
}

/**
 * A real OpenAI-compatible HTTP server on loopback (`POST /v1/chat/completions`) whose answers the test scripts:
 * `reply` gets each request (numbered from 1) and returns the answer, so tests inject 429s, 500s, hangs and junk.
 */
export async function startModelServer(
  reply: (request: ChatRequest, n: number) => ChatReply,
): Promise<ModelServer> {
  const requests: ChatRequest[] = [];
  const hung = new Set<http.ServerResponse>();
  const server = http.createServer((req, res) => {
    onChatRequest(req, (request) => {
      requests.push(request);
      const answer = reply(request, requests.length);
      if (answer === 'hang') {
        hung.add(res);
        return;
      }
      const send = (): void => {
        hung.delete(res);
        if (res.destroyed) return;
        res.writeHead(answer.status ?? 200, { 'content-type': 'application/json', ...answer.headers });
        res.end(typeof answer.body === 'string' ? answer.body : JSON.stringify(answer.body));
      };
      if (answer.delayMs === undefined) {
        send();
      } else {
        hung.add(res);
        setTimeout(send, answer.delayMs);
      }
    });
  });
  const origin = await listenOnLoopback(server, 'model server');
  return {
    baseUrl: `${origin}/v1`,
    requests,
    close: async () => {
      for (const res of hung) res.destroy();
      await closeServer(server);
    },
  };
}

/** A scripted model server (see startModelServer), closed after the file's tests. */
export async function modelServerFor(
  defer: Defer,
  reply: (request: ChatRequest, n: number) => ChatReply,
): Promise<ModelServer> {
  const server = await startModelServer(reply);
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
): OpenAICompatibleModel {
  return new OpenAICompatibleModel({
    baseUrl: server.baseUrl,
    model: options.model ?? 'test-model',
    apiKey: 'apiKey' in options ? options.apiKey : 'test-key',
    requestTimeoutMs: options.requestTimeoutMs ?? 5_000,
  });
}

/** The system prompt of a chat request, to tell summarize calls from tag calls. */
export function isTagRequest(request: ChatRequest): boolean {
  return JSON.stringify(request.body).includes('topic tags');
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
export const normalAnswer: (request: ChatRequest) => ChatReply = answering(SUMMARY, TAGS);

// ---------------------------------------------------------------------------------------------------------------
// Other loopback servers
// ---------------------------------------------------------------------------------------------------------------

/**
 * Starts `server` on a free loopback port and returns its origin, `http://127.0.0.1:<port>`. `what` names the
 * server in the error thrown if it did not bind a TCP port.
 */
export async function listenOnLoopback(server: http.Server, what = 'server'): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error(`${what} did not bind a TCP port`);
  return `http://127.0.0.1:${address.port}`;
}

/** Closes `server` at once: its open connections too, held requests included. */
export async function closeServer(server: http.Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

/** A TCP port that was free a moment ago on loopback (the OS picks it; the caller binds it soon after). */
export async function freePort(): Promise<number> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === 'string') throw new Error('could not find a free port');
  return address.port;
}
