/**
 * Shared parts for tests: real-but-local dependencies (SQLite files in a temp folder, an OpenAI-compatible HTTP
 * server on loopback), the Temporal binaries, and one workflow bundle per test process.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { bundleWorkflowCode } from '@temporalio/worker';
import type { WorkflowBundleWithSourceMap } from '@temporalio/worker';
import type { EphemeralServerExecutable } from '@temporalio/testing';
import { blobTextSource } from '../activities/document-text';
import type { ActivityDependencies } from '../activities';
import { resolveTemporalExecutable } from '../src/binaries';
import { BlobStore } from '../src/blobs';
import { AnswerMemo } from '../src/model/memo';
import { OfflineModel } from '../src/model/offline-model';
import type { DocumentModel } from '../src/model/types';
import { PublicationStore } from '../src/publisher/publication-store';
import { SqlitePublisher } from '../src/publisher/sqlite-publisher';
import type { Publisher } from '../src/publisher/types';
import { INPUT_SCHEMA_VERSION } from '../src/shared';
import type { PipelineInput, PipelineOptions } from '../src/shared';

/** The Temporal CLI (dev server) or the time-skipping test server: env variable, PATH, else SDK download. */
export function temporalExecutable(binary: 'cli' | 'test-server'): EphemeralServerExecutable {
  const explicit = binary === 'cli' ? process.env.TEMPORAL_CLI_PATH : process.env.TEMPORAL_TEST_SERVER_PATH;
  return resolveTemporalExecutable(binary, explicit === '' ? undefined : explicit);
}

let bundle: Promise<WorkflowBundleWithSourceMap> | undefined;
/** The workflow code, bundled once per test file and reused by every worker in it. */
export function workflowBundle(): Promise<WorkflowBundleWithSourceMap> {
  bundle ??= bundleWorkflowCode({ workflowsPath: require.resolve('../workflows'), logger: quietLogger });
  return bundle;
}

const noop = (): void => {};
const quietLogger = { trace: noop, debug: noop, info: noop, warn: noop, error: noop, log: noop };

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

/** Real activity dependencies in a temp folder: blob store, memo and publication database as in production. */
export function localParts({
  dir = tempDir(),
  model = new OfflineModel(),
  publisher,
  maxDocumentBytes = 1_000_000,
}: {
  dir?: string;
  model?: DocumentModel;
  publisher?: Publisher;
  maxDocumentBytes?: number;
} = {}): LocalParts {
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

export interface ChatRequest {
  idempotencyKey: string | undefined;
  authorization: string | undefined;
  body: unknown;
}

/** How the fake model answers one request: a status, headers and a body; or `hang` to never answer. */
export type ChatReply = { status?: number; headers?: Record<string, string>; body: unknown } | 'hang';

export interface ModelServer {
  baseUrl: string;
  requests: ChatRequest[];
  close(): Promise<void>;
}

/** A chat-completions body with `content`, the way OpenAI-compatible servers answer. */
export function completion(content: string, usage = { prompt_tokens: 100, completion_tokens: 20 }): unknown {
  return { choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }], usage };
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
      const request = {
        idempotencyKey: header('idempotency-key'),
        authorization: header('authorization'),
        body,
      };
      requests.push(request);
      const answer = reply(request, requests.length);
      if (answer === 'hang') {
        hung.add(res);
        return;
      }
      res.writeHead(answer.status ?? 200, { 'content-type': 'application/json', ...answer.headers });
      res.end(typeof answer.body === 'string' ? answer.body : JSON.stringify(answer.body));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string')
    throw new Error('model server did not bind a TCP port');
  return {
    baseUrl: `http://127.0.0.1:${address.port}/v1`,
    requests,
    close: async () => {
      for (const res of hung) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** The system prompt of a chat request, to tell summarize calls from tag calls. */
export function isTagRequest(request: ChatRequest): boolean {
  return JSON.stringify(request.body).includes('topic tags');
}
