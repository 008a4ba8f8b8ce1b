/**
 * Ways out of an entry point that are not its normal end. Whatever the entry point started stops with the process
 * (the embedded server registers its own exit hook), so these only choose how quietly the process goes.
 */

/**
 * `npm start | head`: once the reader is gone, writing to stdout fails with EPIPE. Exit at once, without a stack
 * trace, as a command killed by SIGPIPE would; the exit hooks stop what this process started.
 */
export function exitQuietlyWhenOutputCloses(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EPIPE') process.exit(0);
      throw err;
    });
  }
}
