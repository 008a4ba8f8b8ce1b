import { ConfigError } from '../config';
import { errorFields, logger, logsStacks } from '../telemetry/log';

/** A failure whose message says what to do: logged as one line, its stack only at LOG_LEVEL=debug. */
export class UserFacingError extends Error {
  override name = 'UserFacingError';
}

/**
 * The one ending of every entry point: log the error and exit non-zero. A mistake a person can fix from the
 * message (configuration, no server) is one line; the stack is for LOG_LEVEL=debug and for the unexpected.
 */
export function runMain(run: () => Promise<void>): void {
  exitQuietlyWhenOutputCloses();
  run().catch((err: unknown) => {
    const log = logger();
    const details = (e: Error) => (logsStacks(log) ? errorFields(e, true) : {});
    if (err instanceof ConfigError) log.error(details(err), `Configuration error: ${err.message}`);
    else if (err instanceof UserFacingError) log.error(details(err), err.message);
    else if (err instanceof Error && err.name === 'PromiseCompletionTimeoutError') {
      // The SDK stopped the worker on a signal (SIGTERM: a deploy, docker stop) before the job was done.
      log.warn(
        details(err),
        'Stopped by a signal before the work was done; run the same command again to resume',
      );
    } else log.error(errorFields(err, true), err instanceof Error ? err.message : String(err));
    process.exit(1);
  });
}

/**
 * `npm start | head`: once the reader is gone, writing to stdout fails with EPIPE. Exit at once, without a stack
 * trace, as a command killed by SIGPIPE would; the exit hooks stop what this process started.
 */
function exitQuietlyWhenOutputCloses(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EPIPE') process.exit(0);
      throw err;
    });
  }
}
