import path from 'node:path';
import { Worker } from 'node:worker_threads';

/** What a thread's module answers for one request: its value, or the message of what it threw. */
export type ThreadReply<T> = { id: number; value: T } | { id: number; error: string };

/**
 * CPU-bound work on one thread of its own, one request at a time in the order asked, so the event loop stays free
 * for everything else the process does (a worker's workflow tasks, heartbeats, the stores' commits). The thread is
 * started on the first request and kept; it keeps the process alive only while a request is out. A thread that
 * dies fails the requests it had, and the next request starts a new one.
 *
 * `module` is the thread's code, a module of this project (a `.ts` file is loaded through tsx, as the process that
 * runs from source loads its own), which answers each `{ id, ...request }` message with a ThreadReply of the same
 * id (see serveRequests).
 */
export class RequestThread<Request extends object, Value> {
  private worker: Worker | undefined;
  private nextId = 0;
  private readonly pending = new Map<
    number,
    { resolve: (value: Value) => void; reject: (err: Error) => void }
  >();

  constructor(
    /** Names the thread in errors: "the offline model's thread". */
    private readonly name: string,
    private readonly module: string,
  ) {}

  /** The thread's answer to `request`; rejects at once when `signal` aborts (the thread's answer is then dropped). */
  call(request: Request, signal?: AbortSignal): Promise<Value> {
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    const worker = this.started();
    const id = this.nextId++;
    return new Promise<Value>((resolve, reject) => {
      const onAbort = (): void => {
        if (this.settle(id)) reject(abortReason(signal));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.pending.set(id, {
        resolve: (value) => {
          signal?.removeEventListener('abort', onAbort);
          resolve(value);
        },
        reject: (err) => {
          signal?.removeEventListener('abort', onAbort);
          reject(err);
        },
      });
      worker.ref();
      worker.postMessage({ ...request, id });
    });
  }

  /** Ends the thread; requests still out fail. */
  async close(): Promise<void> {
    const worker = this.worker;
    this.worker = undefined;
    this.failAll(new Error(`${this.name} was closed`));
    await worker?.terminate();
  }

  private started(): Worker {
    if (this.worker !== undefined) return this.worker;
    const worker = new Worker(threadCode(this.module), { eval: true });
    worker.unref();
    worker.on('message', (reply: ThreadReply<Value>) => {
      const waiting = this.pending.get(reply.id);
      if (!this.settle(reply.id) || waiting === undefined) return;
      if ('error' in reply) waiting.reject(new Error(`${this.name} failed: ${reply.error}`));
      else waiting.resolve(reply.value);
    });
    const lost = (why: string): void => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      this.failAll(new Error(`${this.name} ended (${why}); the next request starts a new one`));
    };
    worker.on('error', (err) => lost(err.message));
    worker.on('exit', (code) => lost(`exit code ${code}`));
    this.worker = worker;
    return worker;
  }

  /** Forgets request `id`; true if it was still out. Lets the thread go quiet once nothing is. */
  private settle(id: number): boolean {
    const had = this.pending.delete(id);
    if (this.pending.size === 0) this.worker?.unref();
    return had;
  }

  private failAll(err: Error): void {
    const waiting = [...this.pending.values()];
    this.pending.clear();
    for (const { reject } of waiting) reject(err);
  }
}

/** Whether this thread serves requests already (see serveRequests). */
let serving = false;

/**
 * Inside the thread: answers each request with what `handle` returns, or with the message of what it threw. Call
 * it once, at the top of the thread's module.
 */
export function serveRequests<Request, Value>(
  port: {
    on(event: 'message', listener: (message: Request & { id: number }) => void): unknown;
    postMessage(reply: ThreadReply<Value>): void;
  },
  handle: (request: Request) => Value,
): void {
  // Two handlers would both answer each request, and the first answer would win.
  if (serving)
    throw new Error('this thread answers requests already: a thread has one module that serves them');
  serving = true;
  port.on('message', (message) => {
    let reply: ThreadReply<Value>;
    try {
      reply = { id: message.id, value: handle(message) };
    } catch (err) {
      reply = { id: message.id, error: err instanceof Error ? err.message : String(err) };
    }
    port.postMessage(reply);
  });
}

/** The eval'd start of a thread: its module, required through tsx when it is TypeScript. */
function threadCode(module: string): string {
  const file = JSON.stringify(module);
  // A thread does not inherit the loader hooks `--import tsx` gave this one; tsx's require hook does the same work.
  return path.extname(module) === '.ts'
    ? `require(${JSON.stringify(require.resolve('tsx/cjs'))}); require(${file});`
    : `require(${file});`;
}

function abortReason(signal: AbortSignal | undefined): Error {
  const reason: unknown = signal?.reason;
  return reason instanceof Error ? reason : new Error('the request was aborted');
}
