import { ConfigError } from '../config';

/** What `npm start` and `npm run pipeline` take: files and folders, and `--rerun`. */
export interface RunArgs {
  paths: string[];
  /** Process the documents again as new runs, also those whose version was done earlier. */
  rerun: boolean;
}

/** The command line after the script name; an option it does not know is refused, naming the ones it does. */
export function parseRunArgs(args: readonly string[]): RunArgs {
  const paths: string[] = [];
  let rerun = false;
  for (const arg of args) {
    if (arg === '--rerun') rerun = true;
    else if (arg.startsWith('--')) {
      throw new ConfigError(
        `unknown option ${arg}; the options are --rerun (process the documents again as new runs)`,
      );
    } else paths.push(arg);
  }
  return { paths, rerun };
}
