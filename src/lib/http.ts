import { ApplicationFailure } from '@temporalio/common';

/** Longest server-requested wait we honour; beyond it the retry policy's own backoff applies. */
const MAX_RETRY_AFTER_MS = 24 * 60 * 60 * 1000;

/** Parses a Retry-After header (seconds or an HTTP date) into milliseconds from now. */
function parseRetryAfter(header: string | null | undefined, now = Date.now()): number | undefined {
  if (header === null || header === undefined || header.trim() === '') return undefined;
  const trimmed = header.trim();
  const ms = /^\d+(\.\d+)?$/.test(trimmed) ? Number(trimmed) * 1000 : Date.parse(trimmed) - now;
  if (!Number.isFinite(ms)) return undefined;
  return Math.min(Math.max(ms, 0), MAX_RETRY_AFTER_MS);
}

/**
 * The wait a server asks for before a retry, in milliseconds: `retry-after-ms` (OpenAI sends it) over
 * `retry-after` (seconds or an HTTP date), both capped at a day.
 */
export function retryAfterOf(headers: Headers, now = Date.now()): number | undefined {
  const ms = Number(headers.get('retry-after-ms') ?? Number.NaN);
  if (Number.isFinite(ms)) return Math.min(Math.max(ms, 0), MAX_RETRY_AFTER_MS);
  return parseRetryAfter(headers.get('retry-after'), now);
}

/**
 * The most of an answer's body postJson and getJson keep (64 KiB): a receiver's receipt or a lookup's answer is a
 * few hundred bytes, and a server answering a gigabyte must not fill the worker's memory. The rest is never read.
 */
export const MAX_ANSWER_BYTES = 64 * 1024;

export interface HttpAnswer {
  status: number;
  headers: Headers;
  retryAfterMs: number | undefined;
  /** The body as UTF-8, at most `maxBodyBytes` of it. */
  body: string;
  /** True when the body went on past the cap: `body` is its beginning, and the rest was never read. */
  truncated: boolean;
}

export interface PostOptions {
  headers: Record<string, string>;
  timeoutMs: number;
  /** The activity's cancellation signal: a cancelled or timed-out activity stops waiting at once. */
  signal: AbortSignal;
  /**
   * Names the remote system in error messages, e.g. "model server https://api.example.com/v1/chat/completions".
   * Messages end up in workflow histories and logs: never put secrets (tokens in a URL's path or query) here.
   */
  what: string;
  /** Failure type for errors worth retrying (connection refused or reset, request timeout). */
  transientType: string;
  /** Headers made from the exact body sent, e.g. a signature over it; added to `headers`. */
  bodyHeaders?: (body: string) => Record<string, string>;
  /** The most of the answer's body read (MAX_ANSWER_BYTES). */
  maxBodyBytes?: number;
}

/**
 * POSTs JSON, following no redirect; a connection error or timeout becomes a retryable ApplicationFailure naming
 * the system.
 */
export async function postJson(url: string, body: unknown, options: PostOptions): Promise<HttpAnswer> {
  const timeout = AbortSignal.timeout(options.timeoutMs);
  const text = JSON.stringify(body);
  try {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...options.headers, ...options.bodyHeaders?.(text) },
      body: text,
      // Never followed: a 301/302 would turn the POST into a GET, a 307 would send the body (and its signature)
      // wherever Location names. The caller sees the 3xx itself.
      redirect: 'manual',
      signal: AbortSignal.any([timeout, options.signal]),
    });
    return await answerOf(response, options.maxBodyBytes);
  } catch (err) {
    if (options.signal.aborted) throw err;
    const reason = timeout.aborted
      ? `no answer within ${options.timeoutMs} ms`
      : `request failed (${describeCauses(err)})`;
    // A refused connection (or an unknown host) sent nothing; anything else may have reached the server.
    throw ApplicationFailure.create({
      type: options.transientType,
      message: `${options.what}: ${reason}`,
      details: [neverSent(err) ? NOT_SENT : 'may-have-arrived'],
    });
  }
}

/**
 * GETs a URL, following no redirect, reading at most `maxBodyBytes` (MAX_ANSWER_BYTES) of the answer; a connection
 * error or timeout throws as fetch does.
 */
export async function getJson(
  url: string,
  options: { headers: Record<string, string>; timeoutMs: number; signal: AbortSignal; maxBodyBytes?: number },
): Promise<HttpAnswer> {
  const response = await fetch(url, {
    headers: { accept: 'application/json', ...options.headers },
    redirect: 'manual',
    signal: AbortSignal.any([AbortSignal.timeout(options.timeoutMs), options.signal]),
  });
  return answerOf(response, options.maxBodyBytes);
}

async function answerOf(response: Response, maxBodyBytes = MAX_ANSWER_BYTES): Promise<HttpAnswer> {
  const { text, truncated } = await readCapped(response, maxBodyBytes);
  return {
    status: response.status,
    headers: response.headers,
    retryAfterMs: retryAfterOf(response.headers),
    body: text,
    truncated,
  };
}

/**
 * Reads a response's body up to `max` bytes, then cancels the stream (fetch closes the connection), so what a
 * server sends past the cap is never buffered. The request's abort signal still bounds the read in time.
 */
export async function readCapped(
  response: Response,
  max: number,
): Promise<{ text: string; truncated: boolean }> {
  if (response.body === null) return { text: '', truncated: false };
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  let truncated = false;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (value.byteLength > max - size) {
      chunks.push(value.subarray(0, max - size));
      truncated = true;
      // A server may still be sending; cancelling drops the connection instead of reading it to its end.
      await reader.cancel().catch(() => undefined);
      break;
    }
    chunks.push(value);
    size += value.byteLength;
  }
  return { text: new TextDecoder().decode(Buffer.concat(chunks)), truncated };
}

const NOT_SENT = 'not-sent';

/** True for a failure of postJson that provably sent nothing (a refused connection, an unknown host). */
export function failedBeforeSending(err: unknown): err is ApplicationFailure {
  return err instanceof ApplicationFailure && err.details?.[0] === NOT_SENT;
}

/** The classic split: 408, 429 and 5xx are worth retrying (after Retry-After when given), other 4xx are not. */
export function isRetryableStatus(status: number): boolean {
  return status === 408 || status === 429 || status >= 500;
}

/** A retryable failure for a transient HTTP status, carrying the server's Retry-After as the next delay. */
export function transientStatusFailure(
  answer: Pick<HttpAnswer, 'status' | 'headers' | 'retryAfterMs' | 'body'>,
  what: string,
  type: string,
): ApplicationFailure {
  const wait =
    answer.retryAfterMs === undefined ? '' : `; Retry-After ${retryAfterWords(answer.retryAfterMs)}`;
  return ApplicationFailure.create({
    type,
    message: `${what} answered HTTP ${answer.status}${wait}: ${excerpt(answer.body)}`,
    nextRetryDelay: answer.retryAfterMs,
  });
}

/**
 * A server's requested wait for a person, never rounded down: `400 ms`, `1.4 s`, `7 s` ("Retry-After 0 s" for a
 * 400 ms wait read as "at once").
 */
export function retryAfterWords(ms: number): string {
  return ms < 1_000 ? `${Math.ceil(ms)} ms` : `${Math.ceil(ms / 100) / 10} s`;
}

/** Shortens a response body for an error message. */
export function excerpt(text: string, max = 300): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  if (flat === '') return '(empty body)';
  return flat.length > max ? `${flat.slice(0, max)}…` : flat;
}

function neverSent(err: unknown): boolean {
  const cause = err instanceof Error ? err.cause : undefined;
  const code = cause instanceof Error && 'code' in cause ? cause.code : undefined;
  return code === 'ECONNREFUSED' || code === 'ENOTFOUND' || code === 'EAI_AGAIN';
}

/** An error's message with its causes', e.g. "fetch failed: connect ECONNREFUSED 127.0.0.1:9" (up to four). */
export function describeCauses(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const parts: string[] = [];
  for (let e: unknown = err; e instanceof Error && parts.length < 4; e = e.cause) {
    const { message } = e;
    if (!parts.some((p) => p.includes(message))) parts.push(message);
  }
  return parts.join(': ');
}
