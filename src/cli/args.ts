import './compose';
import { ConfigError } from '../config';

/** What `npm start` and `npm run pipeline` take: files and folders, `--rerun`, and a budget. */
export interface RunArgs {
  paths: string[];
  /** Process the documents again as new runs, also those whose version was done earlier. */
  rerun: boolean;
  /** What the batch's model calls may spend together (`--budget-usd`, `--budget-tokens`); absent: no limit. */
  budget?: { usd?: number; tokens?: number };
  /** `--bulk`: the model requests go to the provider's batch API first (as BULK=on); absent without it. */
  bulk?: true;
}

const OPTIONS =
  'the options are --rerun (process the documents again as new runs), --budget-usd N and --budget-tokens N ' +
  "(what the batch's model calls may spend; past it they pause until npm run budget -- raise), and --bulk " +
  "(the model requests go to the provider's batch API first, at half the price: docs/bulk.md)";

/** The command line after the script name; an option it does not know is refused, naming the ones it does. */
export function parseRunArgs(args: readonly string[]): RunArgs {
  const paths: string[] = [];
  let rerun = false;
  let bulk = false;
  const budget: { usd?: number; tokens?: number } = {};
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] ?? '';
    const [flag, inline] = arg.includes('=')
      ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)]
      : [arg];
    if (arg === '--rerun') rerun = true;
    else if (arg === '--bulk') bulk = true;
    else if (flag === '--budget-usd' || flag === '--budget-tokens') {
      const raw = inline ?? args[++i];
      const n = Number(raw);
      const whole = flag === '--budget-tokens';
      if (
        raw === undefined ||
        raw.trim() === '' ||
        !Number.isFinite(n) ||
        n <= 0 ||
        (whole && !Number.isInteger(n))
      )
        throw new ConfigError(
          `${flag} needs a positive ${whole ? 'whole ' : ''}number, e.g. ${flag} ${whole ? '200000' : '0.50'}`,
        );
      if (whole) budget.tokens = n;
      else budget.usd = n;
    } else if (arg.startsWith('--')) {
      throw new ConfigError(`unknown option ${arg}; ${OPTIONS}`);
    } else paths.push(arg);
  }
  return {
    paths,
    rerun,
    ...(bulk ? { bulk: true as const } : {}),
    ...(Object.keys(budget).length > 0 ? { budget } : {}),
  };
}
