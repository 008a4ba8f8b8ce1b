import { ConfigError } from '../config';

/** The one ending of every entry point: print the error (without a stack for a config mistake), exit non-zero. */
export function runMain(run: () => Promise<void>): void {
  run().catch((err: unknown) => {
    if (err instanceof ConfigError) console.error(`Configuration error: ${err.message}`);
    else console.error(err);
    process.exit(1);
  });
}
