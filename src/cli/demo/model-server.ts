/**
 * A stand-in for a paid model: an OpenAI-compatible chat-completions server on loopback. It logs every request
 * with its idempotency key and its fate (answered, cut off when the caller went away), so the demo and the tests
 * count the model calls really made, from outside the worker they kill. A script decides each answer: the demo's
 * is slow and sensible, the tests' inject 429s, 500s, hangs and junk.
 */
import http from 'node:http';
import { z } from 'zod';
import type { ModelStepName } from '../../contract';
import { closeServer, listenOnLoopback } from '../../lib/loopback';

/** One request that reached the server. */
export interface ChatRequest {
  /** The `idempotency-key` header, `<run ID>:<step>`; undefined when none was sent. */
  idempotencyKey: string | undefined;
  authorization: string | undefined;
  /** The JSON body; undefined when it was not JSON. */
  body: unknown;
  /**
   * The first path segment when the base URL had one (`<origin>/<route>/v1`): a test gives each worker host its
   * own route, to tell whose call it is.
   */
  route: string | undefined;
  /** Which step asked, told apart by the prompt. */
  step: ModelStepName;
  receivedAt: number;
  /** When the answer was sent; undefined while open, or for a call cut off before it. */
  answeredAt: number | undefined;
  /** The caller went away (its worker was killed, its attempt timed out) before the answer was sent. */
  cutOff: boolean;
}

/** How the server answers one request: a status, headers and a body, after an optional delay; or never. */
export type ChatReply =
  { status?: number; headers?: Record<string, string>; body: unknown; delayMs?: number } | 'hang';

export type ChatScript = (request: ChatRequest, n: number) => ChatReply;

export interface ModelServer {
  /** For OPENAI_BASE_URL, with MODEL=openai-compatible:<model> (or OPENAI_MODEL). */
  baseUrl: string;
  /** Every request received, in order of arrival. */
  requests: ChatRequest[];
  /** The requests held open right now, waiting for their answer. */
  open(): ChatRequest[];
  close(): Promise<void>;
}

/** A chat-completions body with `content`, the way OpenAI-compatible servers answer. */
export function completion(content: string, usage = { prompt_tokens: 100, completion_tokens: 20 }): unknown {
  return { choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }], usage };
}

/** The tag step's prompt asks for "topic tags"; everything else is a summarize request. */
function stepOf(rawBody: string): ModelStepName {
  return rawBody.includes('topic tags') ? 'tag' : 'summarize';
}

/** Starts the server on a free loopback port; `script` gets each request (numbered from 1) and returns the answer. */
export async function startModelServer(script: ChatScript): Promise<ModelServer> {
  const requests: ChatRequest[] = [];
  const held = new Set<http.ServerResponse>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      // The chat-completions path, with a route in front of it for a base URL that has one.
      const segments = (req.url ?? '').split('/').slice(1);
      const route = segments.length === 4 ? segments[0] : undefined;
      const known = segments.slice(-3).join('/') === 'v1/chat/completions' && segments.length <= 4;
      if (req.method !== 'POST' || !known) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'POST /v1/chat/completions is the only route' } }));
        return;
      }
      const raw = Buffer.concat(chunks).toString('utf8');
      let body: unknown;
      try {
        body = JSON.parse(raw);
      } catch {
        body = undefined;
      }
      const header = (name: string): string | undefined => {
        const value = req.headers[name];
        return typeof value === 'string' ? value : undefined;
      };
      const request: ChatRequest = {
        idempotencyKey: header('idempotency-key'),
        authorization: header('authorization'),
        body,
        route,
        step: stepOf(raw),
        receivedAt: Date.now(),
        answeredAt: undefined,
        cutOff: false,
      };
      requests.push(request);
      res.on('close', () => {
        held.delete(res);
        if (request.answeredAt === undefined) request.cutOff = true;
      });
      const answer = script(request, requests.length);
      if (answer === 'hang') {
        held.add(res);
        return;
      }
      const send = (): void => {
        if (res.destroyed) return;
        request.answeredAt = Date.now();
        res.writeHead(answer.status ?? 200, { 'content-type': 'application/json', ...answer.headers });
        res.end(typeof answer.body === 'string' ? answer.body : JSON.stringify(answer.body));
      };
      if (answer.delayMs === undefined) return send();
      held.add(res);
      const timer = setTimeout(send, answer.delayMs);
      res.on('close', () => clearTimeout(timer));
    });
  });
  const origin = await listenOnLoopback(server, 'model server');
  return {
    baseUrl: `${origin}/v1`,
    requests,
    open: () => requests.filter((r) => r.answeredAt === undefined && !r.cutOff),
    close: async () => {
      for (const res of held) res.destroy();
      await closeServer(server);
    },
  };
}

const ChatBodySchema = z.object({
  messages: z.array(z.object({ role: z.string(), content: z.string() })),
});

/** The user message of a chat request: the document text the step sent; empty when it is no chat request. */
function userText(body: unknown): string {
  const parsed = ChatBodySchema.safeParse(body);
  if (!parsed.success) return '';
  return parsed.data.messages.find((m) => m.role === 'user')?.content ?? '';
}

/**
 * The demo's model: answers after `delayMs`, summaries are the text's first sentence and tags its most frequent
 * long words. A body that is not a chat request gets a 400, as a real provider's would.
 */
export function demoModel(delayMs: number | (() => number)): ChatScript {
  return (request) => {
    const text = userText(request.body);
    if (text === '')
      return { status: 400, body: { error: { message: 'expected a chat completion request' } } };
    const content =
      request.step === 'tag' ? JSON.stringify({ tags: frequentWords(text, 3) }) : firstSentence(text);
    const delay = typeof delayMs === 'number' ? delayMs : delayMs();
    return {
      body: completion(content, {
        prompt_tokens: Math.ceil(text.length / 4),
        completion_tokens: Math.ceil(content.length / 4),
      }),
      delayMs: delay,
    };
  };
}

/** The Markdown's prose without headings, code fences and emphasis marks, on one line. */
function prose(markdown: string): string {
  return markdown
    .replace(/```[\s\S]*?```/g, ' ')
    .split('\n')
    .filter((line) => !/^\s*(#|[-*_]{3,}\s*$|\|)/.test(line))
    .join(' ')
    .replace(/[*_`>]/g, '')
    .replace(/\s+/g, ' ')
    .trim();
}

/** The demo model's summary: the first sentence of the text, at most 200 characters. */
function firstSentence(markdown: string): string {
  const text = prose(markdown);
  const sentence = /^.+?[.!?](?=\s|$)/.exec(text)?.[0] ?? text;
  const short = sentence.length > 200 ? `${sentence.slice(0, 199)}…` : sentence;
  return short === '' ? 'An empty document.' : short;
}

/** The demo model's tags: the text's most frequent words of six letters or more. */
function frequentWords(markdown: string, count: number): string[] {
  const counts = new Map<string, number>();
  for (const word of prose(markdown)
    .toLowerCase()
    .match(/\p{L}{6,}/gu) ?? [])
    counts.set(word, (counts.get(word) ?? 0) + 1);
  const words = [...counts.entries()].sort((a, b) => b[1] - a[1]).map(([word]) => word);
  return words.length > 0 ? words.slice(0, count) : ['document'];
}
