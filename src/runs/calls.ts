import type { Client } from '@temporalio/client';

/** Calls to Temporal that take longer than this are given up (a query waits for a worker to answer it). */
const CALL_TIMEOUT_MS = 10_000;

/**
 * The calls a client makes to Temporal for one job, so that the job can be stopped by a signal and waited on
 * until no call is out.
 *
 * Each call gets a deadline and an abort signal of its own, which the job's signal aborts while the call is out:
 * the SDK adds a listener to the signal of every call and never removes it, so one signal shared by every call
 * of a long job piles them up (and Node warns of a leak past ten). A call asked for once the job's signal has fired is
 * not made. `drained()` resolves once every call made has settled, its retries included: the SDK's retry
 * interceptor retries on a timer that cancelling does not clear, and a retry that finds the connection closed
 * throws from that timer and takes the process down.
 */
export class ClientCalls {
  private readonly out = new Set<Promise<void>>();
  /** The signals of the calls out, all aborted by the job's one listener. */
  private readonly cancels = new Set<AbortController>();
  /** Resolves once the job's signal fires (never, without one): wakes the job's waits between calls. */
  readonly stopped: Promise<void>;

  constructor(
    private readonly client: Client,
    private readonly signal: AbortSignal | undefined,
  ) {
    this.stopped = new Promise<void>((resolve) => {
      if (signal?.aborted === true) resolve();
      signal?.addEventListener(
        'abort',
        () => {
          for (const cancel of this.cancels) cancel.abort(signal.reason);
          resolve();
        },
        { once: true },
      );
    });
  }

  /** True once the job's signal has fired: no call is made any more. */
  get isStopped(): boolean {
    return this.signal?.aborted === true;
  }

  /** Throws the job's signal's reason once it has fired. */
  throwIfStopped(): void {
    this.signal?.throwIfAborted();
  }

  run<T>(call: () => Promise<T>, timeoutMs = CALL_TIMEOUT_MS): Promise<T> {
    if (this.isStopped) return Promise.reject(this.signal?.reason as Error);
    const own = new AbortController();
    this.cancels.add(own);
    const { connection } = this.client;
    const made = connection.withDeadline(Date.now() + timeoutMs, () =>
      connection.withAbortSignal(own.signal, call),
    );
    const settled: Promise<void> = made
      .then(
        () => undefined,
        () => undefined,
      )
      .finally(() => {
        this.cancels.delete(own);
        this.out.delete(settled);
      });
    this.out.add(settled);
    return made;
  }

  /** Resolves once no call made through here is out. */
  async drained(): Promise<void> {
    while (this.out.size > 0) await Promise.all(this.out);
  }
}
