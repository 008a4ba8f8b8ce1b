/**
 * A stand-in for the providers' batch APIs, on loopback: OpenAI's Batch API (Files: upload and content; Batches:
 * create, retrieve, list, cancel; output and error files) and Anthropic's Message Batches (create, retrieve, list,
 * cancel, results), as each documents them: their paths, headers, object shapes, list pagination (newest first),
 * request validation and error bodies. Each line is answered as the demo's model answers one call
 * (model-server.ts), with usage counted the same way.
 *
 * A batch ends when the test says: after some wall time since it was created (the dev server's tests), or at the
 * n-th look at it (the time-skipping tests, whose workflow timers skip minutes between looks). Faults are scripted
 * per request (an error answer, a refused answer) or per batch (expiry with part of it answered). Everything done
 * is logged, so a test counts from outside the workers: which batches were created with which custom_ids, and how
 * many times each custom_id was answered (paid).
 */
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { z } from 'zod';
import { closeServer, listenOnLoopback } from '../src/lib/loopback';
import {
  answerBody,
  demoContent,
  demoModel,
  errorReply,
  estimateTokens,
  promptText,
  startModelServer,
} from './model-server';
import type { ChatApi, ChatRequest, ChatScript } from './model-server';

export type BatchApiName = 'openai' | 'anthropic';

/** One request line of a served batch, and what became of it. */
export interface ServedLine {
  customId: string;
  body: unknown;
  /** Set when the batch ends: answered (paid), refused (paid, but malformed or cut off), errored, expired or cancelled. */
  outcome?: 'answered' | 'refused' | 'errored' | 'expired' | 'canceled';
}

export interface ServedBatch {
  id: string;
  api: BatchApiName;
  seq: number;
  createdAt: number;
  /** OpenAI's metadata; Anthropic's batches have none. */
  metadata: Record<string, string> | undefined;
  lines: ServedLine[];
  /** OpenAI: validating, in_progress, cancelling, completed, expired, cancelled. Anthropic: in_progress, canceling, ended. */
  status: string;
  looks: number;
  cancelRequested: boolean;
  endedAt?: number;
  /** Why it ended: completed, expired or cancelled (Anthropic's `ended` says only that). */
  end?: 'completed' | 'expired' | 'cancelled';
  outputFileId?: string;
  errorFileId?: string;
}

/** A logged call: what was asked of which batch. */
export interface BatchCall {
  at: number;
  api: BatchApiName;
  action: 'upload' | 'create' | 'retrieve' | 'list' | 'cancel' | 'results' | 'content';
  batchId?: string;
  status: number;
  /** The answer never reached the caller (loseAnswer): what it got instead. */
  lost?: 'reset' | 'gateway';
}

export type LineFault = 'error' | 'refuse' | undefined;

/**
 * How the answer to a create that was carried out is lost on its way back: the connection reset, or a gateway in
 * front of the provider answering 502 Bad Gateway (its own HTML page, as nginx sends it) for an origin that did
 * the work. Either way the caller cannot tell whether the create happened.
 */
export type LostAnswer = 'reset' | 'gateway' | undefined;

export interface BatchServerOptions {
  /** A batch's answers are ready this long after it was created (default 0: at its first look). */
  completeAfterMs?: number;
  /** ...or at this look at it (retrieve, list or results), counting from 1; takes precedence when set. */
  completeAtLook?: number;
  /** ...or once this says so (a test that holds a batch open while it kills and restarts things). */
  completeWhen?: (batch: ServedBatch) => boolean;
  /** A fault for one request line: its batch's sequence number (from 1) and its index in the batch. */
  fault?: (line: { customId: string; batchSeq: number; index: number }) => LineFault;
  /** A batch that expires instead of completing: how many of its lines were answered before it did. */
  expire?: (batchSeq: number, lines: number) => number | undefined;
  /** The API key both APIs require (Authorization: Bearer; Anthropic's x-api-key too). */
  apiKey?: string;
  /** Called once a batch is stored, before the create is answered (a test may kill the caller here). */
  afterCreate?: (batch: ServedBatch) => void | Promise<void>;
  /**
   * Loses the answer to a create after it was carried out (the n-th of its kind, counting from 1): a file upload
   * (stored) or a batch create (the batch made, and it runs), as a reset or a gateway's 502.
   */
  loseAnswer?: (call: { api: BatchApiName; action: 'upload' | 'create'; n: number }) => LostAnswer;
  /** Called before an ended batch's results are sent (the output file, Anthropic's results). */
  beforeResults?: (batch: ServedBatch) => void | Promise<void>;
  /**
   * How the one-by-one APIs under the same base URL answer (chat completions, Messages: what a document's step
   * calls for a request no batch answered); the demo's model, at once, by default.
   */
  direct?: ChatScript;
}

export interface BatchServer {
  /** For OPENAI_BASE_URL and ANTHROPIC_BASE_URL: `<origin>/v1`. */
  baseUrl: string;
  batches: ServedBatch[];
  calls: BatchCall[];
  /** How many times each custom_id was answered (and so paid), over every batch. */
  paid(): Map<string, number>;
  /**
   * Runs every batch still open to its end, as the provider does within its window whether anyone looks or not
   * (a batch no caller knows of included), so that paid() counts what the provider bills.
   */
  runAll(): void;
  /** The one-by-one calls (chat completions, Messages) received, each paid when answered. */
  direct: ChatRequest[];
  close(): Promise<void>;
}

const DEFAULT_KEY = 'sk-local-batch';

export async function startBatchServer(options: BatchServerOptions = {}): Promise<BatchServer> {
  const apiKey = options.apiKey ?? DEFAULT_KEY;
  const batches: ServedBatch[] = [];
  const calls: BatchCall[] = [];
  const files = new Map<string, { purpose: string; filename: string; bytes: Buffer; createdAt: number }>();
  const creates = new Map<string, number>();
  let base = '';

  const newId = (prefix: string): string => `${prefix}${randomBytes(12).toString('hex')}`;

  /** Moves a batch on, as its time or its looks say (or to its end: `runOut`); answers its lines when it ends. */
  const advance = (batch: ServedBatch, runOut = false): void => {
    if (batch.endedAt !== undefined) return;
    if (batch.cancelRequested) {
      if (batch.status === 'cancelling' || batch.status === 'canceling') {
        // The provider answered half before the cancel took: those are paid.
        finish(batch, 'cancelled', Math.floor(batch.lines.length / 2));
      }
      return;
    }
    const due =
      runOut ||
      (options.completeWhen !== undefined
        ? options.completeWhen(batch)
        : options.completeAtLook !== undefined
          ? batch.looks >= options.completeAtLook
          : Date.now() - batch.createdAt >= (options.completeAfterMs ?? 0));
    if (batch.api === 'openai' && batch.status === 'validating') batch.status = 'in_progress';
    if (!due) return;
    const expiredAfter = options.expire?.(batch.seq, batch.lines.length);
    if (expiredAfter !== undefined) finish(batch, 'expired', expiredAfter);
    else finish(batch, 'completed', batch.lines.length);
  };

  const finish = (batch: ServedBatch, end: 'completed' | 'expired' | 'cancelled', answered: number): void => {
    batch.lines.forEach((line, index) => {
      if (index >= answered)
        line.outcome = end === 'expired' ? 'expired' : end === 'cancelled' ? 'canceled' : 'errored';
      else {
        const fault = options.fault?.({ customId: line.customId, batchSeq: batch.seq, index });
        line.outcome = fault === 'error' ? 'errored' : fault === 'refuse' ? 'refused' : 'answered';
      }
    });
    batch.end = end;
    batch.endedAt = Date.now();
    if (batch.api === 'anthropic') batch.status = 'ended';
    else {
      batch.status = end;
      if (batch.lines.some((l) => l.outcome === 'answered' || l.outcome === 'refused'))
        batch.outputFileId = storeFile(outputFileOf(batch), 'batch_output');
      if (batch.lines.some((l) => l.outcome !== 'answered' && l.outcome !== 'refused'))
        batch.errorFileId = storeFile(errorFileOf(batch), 'batch_output');
    }
  };

  const storeFile = (text: string, purpose: string): string => {
    const id = newId('file-');
    files.set(id, { purpose, filename: `${id}.jsonl`, bytes: Buffer.from(text), createdAt: Date.now() });
    return id;
  };

  /** One line's answer body in the API's shape, and its usage. */
  const answerOf = (api: ChatApi, line: ServedLine): unknown => {
    const request = { api, body: line.body };
    const content =
      line.outcome === 'refused' ? 'I would rather not answer in JSON today' : (demoContent(request) ?? '');
    const usage = { inputTokens: estimateTokens(promptText(request)), outputTokens: estimateTokens(content) };
    return answerBody(request, content, usage);
  };

  const outputFileOf = (batch: ServedBatch): string =>
    batch.lines
      .filter((l) => l.outcome === 'answered' || l.outcome === 'refused')
      .map((line) => {
        const body = answerOf('chat', line) as { choices: { finish_reason: string }[] };
        // A refused text answer is cut off: paid, and unusable.
        if (line.outcome === 'refused' && !hasSchema(line.body)) body.choices[0]!.finish_reason = 'length';
        return JSON.stringify({
          id: newId('batch_req_'),
          custom_id: line.customId,
          response: { status_code: 200, request_id: newId('req_'), body },
          error: null,
        });
      })
      .join('\n');

  const errorFileOf = (batch: ServedBatch): string =>
    batch.lines
      .filter((l) => l.outcome !== 'answered' && l.outcome !== 'refused')
      .map((line) =>
        JSON.stringify(
          line.outcome === 'errored'
            ? {
                id: newId('batch_req_'),
                custom_id: line.customId,
                response: {
                  status_code: 500,
                  request_id: newId('req_'),
                  body: {
                    error: {
                      message: 'The server had an error processing your request',
                      type: 'server_error',
                      param: null,
                      code: null,
                    },
                  },
                },
                error: null,
              }
            : {
                id: newId('batch_req_'),
                custom_id: line.customId,
                response: null,
                error: {
                  code: line.outcome === 'expired' ? 'batch_expired' : 'batch_cancelled',
                  message:
                    line.outcome === 'expired'
                      ? 'This request could not be executed before the completion window expired.'
                      : 'This request was not executed because the batch was cancelled.',
                },
              },
        ),
      )
      .join('\n');

  const anthropicResults = (batch: ServedBatch): string =>
    batch.lines
      .map((line) => {
        if (line.outcome === 'answered' || line.outcome === 'refused') {
          const message = answerOf('messages', line) as { stop_reason: string };
          if (line.outcome === 'refused' && !hasSchema(line.body)) message.stop_reason = 'max_tokens';
          return { custom_id: line.customId, result: { type: 'succeeded', message } };
        }
        if (line.outcome === 'errored')
          return {
            custom_id: line.customId,
            result: {
              type: 'errored',
              error: { type: 'error', error: { type: 'api_error', message: 'Internal server error' } },
            },
          };
        return {
          custom_id: line.customId,
          result: { type: line.outcome === 'expired' ? 'expired' : 'canceled' },
        };
      })
      .map((r) => JSON.stringify(r))
      .join('\n');

  const openAiBatch = (b: ServedBatch): unknown => {
    const done = b.lines.filter((l) => l.outcome === 'answered' || l.outcome === 'refused').length;
    const failed = b.endedAt === undefined ? 0 : b.lines.length - done;
    const s = (ms: number | undefined): number | null => (ms === undefined ? null : Math.floor(ms / 1000));
    return {
      id: b.id,
      object: 'batch',
      endpoint: '/v1/chat/completions',
      model: modelOf(b.lines[0]?.body),
      errors: null,
      input_file_id: (b as ServedBatch & { inputFileId?: string }).inputFileId,
      completion_window: '24h',
      status: b.status,
      output_file_id: b.outputFileId ?? null,
      error_file_id: b.errorFileId ?? null,
      created_at: s(b.createdAt),
      in_progress_at: b.status === 'validating' ? null : s(b.createdAt),
      expires_at: s(b.createdAt + 24 * 3600_000),
      finalizing_at: b.end === 'completed' ? s(b.endedAt) : null,
      completed_at: b.end === 'completed' ? s(b.endedAt) : null,
      failed_at: null,
      expired_at: b.end === 'expired' ? s(b.endedAt) : null,
      cancelling_at: b.cancelRequested ? s(b.createdAt) : null,
      cancelled_at: b.end === 'cancelled' ? s(b.endedAt) : null,
      request_counts: { total: b.lines.length, completed: done, failed },
      metadata: b.metadata ?? null,
    };
  };

  const anthropicBatch = (b: ServedBatch): unknown => {
    const count = (o: ServedLine['outcome']): number => b.lines.filter((l) => l.outcome === o).length;
    const iso = (ms: number | undefined): string | null =>
      ms === undefined ? null : new Date(ms).toISOString();
    const ended = b.endedAt !== undefined;
    return {
      id: b.id,
      type: 'message_batch',
      processing_status: b.status,
      request_counts: {
        processing: ended ? 0 : b.lines.length,
        succeeded: count('answered') + count('refused'),
        errored: count('errored'),
        canceled: count('canceled'),
        expired: count('expired'),
      },
      ended_at: iso(b.endedAt),
      created_at: iso(b.createdAt),
      expires_at: iso(b.createdAt + 24 * 3600_000),
      archived_at: null,
      cancel_initiated_at: b.cancelRequested ? iso(b.createdAt) : null,
      results_url: ended ? `${base}/v1/messages/batches/${b.id}/results` : null,
    };
  };

  // The one-by-one APIs, served by the demo's model server behind this one.
  const direct = await startModelServer(options.direct ?? demoModel(0));
  const directOrigin = new URL(direct.baseUrl).origin;
  const forward = async (
    req: http.IncomingMessage,
    body: Buffer,
    res: http.ServerResponse,
  ): Promise<void> => {
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(req.headers))
      if (typeof value === 'string' && name !== 'host' && name !== 'content-length') headers[name] = value;
    const answer = await fetch(`${directOrigin}${req.url ?? '/'}`, { method: 'POST', headers, body });
    res.writeHead(answer.status, {
      'content-type': answer.headers.get('content-type') ?? 'application/json',
    });
    res.end(Buffer.from(await answer.arrayBuffer()));
  };

  /**
   * A page of an API's batches, newest first, after the cursor `afterParam` names (both APIs page so), up to the
   * `limit` asked (20 by default, `most` at most). Each listed batch counts as looked at.
   */
  const listPage = (
    api: BatchApiName,
    url: URL,
    afterParam: string,
    most: number,
  ): { page: ServedBatch[]; hasMore: boolean } => {
    const limit = Math.min(most, Math.max(1, Number(url.searchParams.get('limit') ?? 20)));
    const after = url.searchParams.get(afterParam);
    const newest = batches.filter((b) => b.api === api).reverse();
    const start = after === null ? 0 : newest.findIndex((b) => b.id === after) + 1;
    const page = newest.slice(start, start + limit);
    for (const b of page) {
      b.looks++;
      advance(b);
    }
    return { page, hasMore: start + limit < newest.length };
  };

  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0];
      if (req.method === 'POST' && (path === '/v1/chat/completions' || path === '/v1/messages')) {
        forward(req, Buffer.concat(chunks), res).catch(() => res.destroy());
        return;
      }
      void route(req, Buffer.concat(chunks))
        .then(({ status, body, api, action, batchId, raw }) => {
          let lost: LostAnswer;
          if (status === 200 && (action === 'upload' || action === 'create')) {
            const n = (creates.get(`${api} ${action}`) ?? 0) + 1;
            creates.set(`${api} ${action}`, n);
            lost = options.loseAnswer?.({ api, action, n });
          }
          calls.push({
            at: Date.now(),
            api,
            action,
            ...(batchId === undefined ? {} : { batchId }),
            status,
            ...(lost === undefined ? {} : { lost }),
          });
          if (lost === 'reset') return void req.socket.destroy();
          if (lost === 'gateway') {
            res.writeHead(502, { 'content-type': 'text/html', server: 'nginx' });
            res.end(BAD_GATEWAY_PAGE);
            return;
          }
          if (raw !== undefined) {
            res.writeHead(status, { 'content-type': 'application/binary' });
            res.end(raw);
            return;
          }
          res.writeHead(status, { 'content-type': 'application/json', 'request-id': newId('req_') });
          res.end(JSON.stringify(body));
        })
        .catch((err: unknown) => {
          res.writeHead(500, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ error: { message: String(err), type: 'server_error' } }));
        });
    });
  });

  interface Routed {
    status: number;
    body?: unknown;
    raw?: Buffer | string;
    api: BatchApiName;
    action: BatchCall['action'];
    batchId?: string;
  }

  async function route(req: http.IncomingMessage, body: Buffer): Promise<Routed> {
    const url = new URL(req.url ?? '/', 'http://local');
    const path = url.pathname;
    const method = req.method ?? 'GET';
    if (path.startsWith('/v1/messages/batches')) return anthropic(req, url, method, body);
    const action: BatchCall['action'] = path.startsWith('/v1/files') ? 'upload' : 'create';
    if (req.headers.authorization !== `Bearer ${apiKey}`)
      return {
        ...openAiError(401, 'invalid_request_error', 'Incorrect API key provided', 'invalid_api_key'),
        api: 'openai',
        action,
      };
    // Files.
    if (method === 'POST' && path === '/v1/files') {
      const form = await new Request('http://local/', {
        method: 'POST',
        headers: { 'content-type': req.headers['content-type'] ?? '' },
        body,
      }).formData();
      const file = form.get('file');
      const purpose = form.get('purpose');
      if (!(file instanceof File) || purpose !== 'batch')
        return {
          ...openAiError(400, 'invalid_request_error', "'file' and 'purpose' (batch) are required"),
          api: 'openai',
          action: 'upload',
        };
      const id = newId('file-');
      const bytes = Buffer.from(await file.arrayBuffer());
      files.set(id, { purpose, filename: file.name, bytes, createdAt: Date.now() });
      return {
        status: 200,
        body: {
          id,
          object: 'file',
          bytes: bytes.length,
          created_at: Math.floor(Date.now() / 1000),
          filename: file.name,
          purpose,
          status: 'processed',
        },
        api: 'openai',
        action: 'upload',
      };
    }
    const content = /^\/v1\/files\/([^/]+)\/content$/.exec(path);
    if (method === 'GET' && content !== null) {
      const file = files.get(content[1] ?? '');
      if (file === undefined)
        return {
          ...openAiError(404, 'invalid_request_error', 'No such File object'),
          api: 'openai',
          action: 'content',
        };
      const owner = batches.find((b) => b.outputFileId === content[1] || b.errorFileId === content[1]);
      if (owner !== undefined && owner.outputFileId === content[1]) await options.beforeResults?.(owner);
      return {
        status: 200,
        raw: file.bytes,
        api: 'openai',
        action: 'content',
        ...(owner === undefined ? {} : { batchId: owner.id }),
      };
    }
    // Batches.
    if (method === 'POST' && path === '/v1/batches') return openAiCreate(body);
    if (method === 'GET' && path === '/v1/batches') {
      const { page, hasMore } = listPage('openai', url, 'after', 100);
      return {
        status: 200,
        body: {
          object: 'list',
          data: page.map(openAiBatch),
          first_id: page[0]?.id ?? null,
          last_id: page.at(-1)?.id ?? null,
          has_more: hasMore,
        },
        api: 'openai',
        action: 'list',
      };
    }
    const one = /^\/v1\/batches\/([^/]+)(\/cancel)?$/.exec(path);
    const batch = one === null ? undefined : batches.find((b) => b.id === one[1] && b.api === 'openai');
    if (one !== null && batch === undefined)
      return {
        ...openAiError(404, 'invalid_request_error', `No batch found with id '${one[1]}'.`),
        api: 'openai',
        action: 'retrieve',
      };
    if (batch !== undefined && method === 'GET' && one?.[2] === undefined) {
      batch.looks++;
      advance(batch);
      return { status: 200, body: openAiBatch(batch), api: 'openai', action: 'retrieve', batchId: batch.id };
    }
    if (batch !== undefined && method === 'POST' && one?.[2] === '/cancel') {
      if (batch.endedAt === undefined) {
        batch.cancelRequested = true;
        batch.status = 'cancelling';
      }
      return { status: 200, body: openAiBatch(batch), api: 'openai', action: 'cancel', batchId: batch.id };
    }
    return {
      ...openAiError(404, 'invalid_request_error', `Unknown request URL: ${method} ${path}`),
      api: 'openai',
      action: 'retrieve',
    };
  }

  async function openAiCreate(body: Buffer): Promise<Routed> {
    const parsed = z
      .object({
        input_file_id: z.string(),
        endpoint: z.enum(['/v1/responses', '/v1/chat/completions', '/v1/embeddings', '/v1/completions']),
        completion_window: z.literal('24h'),
        metadata: z.record(z.string().max(64), z.string().max(512)).nullish(),
      })
      .safeParse(jsonOf(body));
    const fail = (message: string): Routed => ({
      ...openAiError(400, 'invalid_request_error', message),
      api: 'openai',
      action: 'create',
    });
    if (!parsed.success)
      return fail(
        `invalid batch: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`,
      );
    const { input_file_id: fileId, endpoint, metadata } = parsed.data;
    if (metadata && Object.keys(metadata).length > 16) return fail('metadata holds at most 16 keys');
    const file = files.get(fileId);
    if (file === undefined) return fail(`No such File object: ${fileId}`);
    if (file.purpose !== 'batch') return fail(`File ${fileId} was not uploaded for purpose 'batch'`);
    const lines: ServedLine[] = [];
    const ids = new Set<string>();
    const models = new Set<string>();
    const rows = file.bytes
      .toString()
      .split('\n')
      .filter((l) => l.trim() !== '');
    if (rows.length > 50_000) return fail('a batch holds at most 50,000 requests');
    for (const [i, row] of rows.entries()) {
      const line = z
        .object({
          custom_id: z.string().min(1),
          method: z.literal('POST'),
          url: z.string(),
          body: z.record(z.string(), z.unknown()),
        })
        .safeParse(jsonOf(Buffer.from(row)));
      if (!line.success) return fail(`line ${i + 1} of the input file is not a batch request`);
      if (line.data.url !== endpoint)
        return fail(`line ${i + 1}: url ${line.data.url} is not the batch's endpoint ${endpoint}`);
      if (ids.has(line.data.custom_id))
        return fail(`line ${i + 1}: duplicate custom_id ${line.data.custom_id}`);
      ids.add(line.data.custom_id);
      models.add(modelOf(line.data.body));
      lines.push({ customId: line.data.custom_id, body: line.data.body });
    }
    if (models.size > 1) return fail('all requests of a batch must use the same model');
    const batch: ServedBatch & { inputFileId?: string } = {
      id: newId('batch_'),
      api: 'openai',
      seq: batches.length + 1,
      createdAt: Date.now(),
      metadata: metadata ?? undefined,
      lines,
      status: 'validating',
      looks: 0,
      cancelRequested: false,
      inputFileId: fileId,
    };
    batches.push(batch);
    await options.afterCreate?.(batch);
    return { status: 200, body: openAiBatch(batch), api: 'openai', action: 'create', batchId: batch.id };
  }

  async function anthropic(
    req: http.IncomingMessage,
    url: URL,
    method: string,
    body: Buffer,
  ): Promise<Routed> {
    const path = url.pathname;
    const err = (status: number, type: string, message: string, action: BatchCall['action']): Routed => ({
      ...(errorReply('messages', status, { type, message }) as { status: number; body: unknown }),
      api: 'anthropic',
      action,
    });
    // The key as x-api-key, or as a bearer token (how Anthropic's newer clients send it).
    if (req.headers['x-api-key'] !== apiKey && req.headers.authorization !== `Bearer ${apiKey}`)
      return err(401, 'authentication_error', 'invalid x-api-key', 'create');
    if (req.headers['anthropic-version'] === undefined)
      return err(400, 'invalid_request_error', 'anthropic-version: header is required', 'create');
    if (method === 'POST' && path === '/v1/messages/batches') {
      const parsed = z
        .object({
          requests: z
            .array(
              z.object({
                custom_id: z.string().regex(/^[a-zA-Z0-9_-]{1,64}$/),
                params: z
                  .object({
                    model: z.string(),
                    max_tokens: z.number().int().min(1),
                    messages: z.array(z.unknown()).min(1),
                  })
                  .passthrough(),
              }),
            )
            .min(1)
            .max(100_000),
        })
        .safeParse(jsonOf(body));
      if (!parsed.success)
        return err(
          400,
          'invalid_request_error',
          parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; '),
          'create',
        );
      const ids = new Set(parsed.data.requests.map((r) => r.custom_id));
      if (ids.size !== parsed.data.requests.length)
        return err(400, 'invalid_request_error', 'custom_id values must be unique', 'create');
      const batch: ServedBatch = {
        id: newId('msgbatch_'),
        api: 'anthropic',
        seq: batches.length + 1,
        createdAt: Date.now(),
        metadata: undefined,
        lines: parsed.data.requests.map((r) => ({ customId: r.custom_id, body: r.params })),
        status: 'in_progress',
        looks: 0,
        cancelRequested: false,
      };
      batches.push(batch);
      await options.afterCreate?.(batch);
      return {
        status: 200,
        body: anthropicBatch(batch),
        api: 'anthropic',
        action: 'create',
        batchId: batch.id,
      };
    }
    if (method === 'GET' && path === '/v1/messages/batches') {
      const { page, hasMore } = listPage('anthropic', url, 'after_id', 1000);
      return {
        status: 200,
        body: {
          data: page.map(anthropicBatch),
          has_more: hasMore,
          first_id: page[0]?.id ?? null,
          last_id: page.at(-1)?.id ?? null,
        },
        api: 'anthropic',
        action: 'list',
      };
    }
    const one = /^\/v1\/messages\/batches\/([^/]+)(\/cancel|\/results)?$/.exec(path);
    const batch = one === null ? undefined : batches.find((b) => b.id === one[1] && b.api === 'anthropic');
    if (batch === undefined)
      return err(404, 'not_found_error', `no message batch ${one?.[1] ?? path}`, 'retrieve');
    if (method === 'GET' && one?.[2] === undefined) {
      batch.looks++;
      advance(batch);
      return {
        status: 200,
        body: anthropicBatch(batch),
        api: 'anthropic',
        action: 'retrieve',
        batchId: batch.id,
      };
    }
    if (method === 'POST' && one?.[2] === '/cancel') {
      if (batch.endedAt === undefined) {
        batch.cancelRequested = true;
        batch.status = 'canceling';
      }
      return {
        status: 200,
        body: anthropicBatch(batch),
        api: 'anthropic',
        action: 'cancel',
        batchId: batch.id,
      };
    }
    if (method === 'GET' && one?.[2] === '/results') {
      if (batch.endedAt === undefined)
        return err(400, 'invalid_request_error', `Message Batch ${batch.id} has not yet ended`, 'results');
      await options.beforeResults?.(batch);
      return {
        status: 200,
        raw: `${anthropicResults(batch)}\n`,
        api: 'anthropic',
        action: 'results',
        batchId: batch.id,
      };
    }
    return err(404, 'not_found_error', `Unknown request URL: ${method} ${path}`, 'retrieve');
  }

  base = await listenOnLoopback(server, 'batch API server');
  return {
    baseUrl: `${base}/v1`,
    batches,
    calls,
    paid() {
      const paid = new Map<string, number>();
      for (const b of batches)
        for (const l of b.lines)
          if (l.outcome === 'answered' || l.outcome === 'refused')
            paid.set(l.customId, (paid.get(l.customId) ?? 0) + 1);
      return paid;
    },
    runAll() {
      for (const batch of batches) advance(batch, true);
    },
    direct: direct.requests,
    async close() {
      await closeServer(server);
      await direct.close();
    },
  };
}

export const LOCAL_BATCH_KEY = DEFAULT_KEY;

/** What nginx answers for an upstream whose answer it lost. */
const BAD_GATEWAY_PAGE =
  '<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n' +
  '<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n';

function openAiError(
  status: number,
  type: string,
  message: string,
  code?: string,
): { status: number; body: unknown } {
  return errorReply('chat', status, { type, message, code: code ?? null }) as {
    status: number;
    body: unknown;
  };
}

function jsonOf(bytes: Buffer): unknown {
  try {
    return JSON.parse(bytes.toString()) as unknown;
  } catch {
    return undefined;
  }
}

function modelOf(body: unknown): string {
  const model = (body as { model?: unknown } | undefined)?.model;
  return typeof model === 'string' ? model : '';
}

/** True when a request asks for a JSON answer (a refused one is then malformed JSON; a text one is cut off). */
function hasSchema(body: unknown): boolean {
  const b = body as { response_format?: unknown; output_config?: unknown } | undefined;
  return b?.response_format !== undefined || b?.output_config !== undefined;
}
