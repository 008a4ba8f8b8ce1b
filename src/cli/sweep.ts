import './compose';
import { parseArgs } from 'node:util';
import { loadConfig } from '../config';
import { runMain } from '../lib/run-main';
import {
  findOpenRuns,
  InvalidDurationError,
  MISSING_DURATION,
  parseDuration,
  sweepUnreferenced,
} from '../runs/retention';
import type { OpenRuns, SweepCounts } from '../runs/retention';
import { openStores } from '../store/open';
import { configuredEndpoint, connectClient, connectionReason } from '../temporal/connection';
import type { ConnectedClient } from '../temporal/connection';

const USAGE = `Usage: npm run sweep -- --older-than <duration> [--dry-run]

Removes model memo entries, settled delivery-ledger rows and document blobs last touched longer than
<duration> ago that no open run needs, from PostgreSQL (DATABASE_URL) or the SQLite files in DATA_DIR.
Open runs are listed on the Temporal server at TEMPORAL_ADDRESS (default localhost:7233); when it cannot
be reached, nothing is removed.

  --older-than <duration>  e.g. 30d, 12h, 90m, 45s or 1d12h (d days, h hours, m minutes, s seconds)
  --dry-run                list the open runs and the cutoff, remove nothing
  -h, --help               show this text`;

/**
 * `npm run sweep -- --older-than <duration> [--dry-run]`: retention. Asks Temporal which pipeline runs and batches
 * are open first, and refuses to sweep when it cannot tell; then removes what is older than the cutoff and not
 * theirs.
 */
async function run(): Promise<void> {
  const args = parseCommandLine(process.argv.slice(2));
  if (args === 'help') {
    console.log(USAGE);
    return;
  }
  if (typeof args === 'string') {
    console.error(`${args}\n\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  const config = loadConfig();
  const { address } = configuredEndpoint(config);
  const refuse = (problem: string, hint: string): void => {
    console.error(
      `${problem}. Nothing was removed: without the list of open runs the sweep cannot tell what is still ` +
        `needed. ${hint}`,
    );
    process.exitCode = 1;
  };
  let connected: ConnectedClient;
  try {
    connected = await connectClient(config, { connectTimeout: '5 seconds' });
  } catch (err) {
    refuse(
      `Cannot reach a Temporal server at ${address} (${connectionReason(err)})`,
      'Start it with npm run server (the embedded server on the data folder), or set TEMPORAL_ADDRESS.',
    );
    return;
  }
  try {
    // The stores first: an open batch's manifest, read from them, says which texts it still needs.
    const stores = await openStores(config);
    try {
      // The cutoff before the listing: what is stored while it runs (a batch started meanwhile) is younger.
      const before = new Date(Date.now() - args.olderThanMs);
      let open: OpenRuns;
      try {
        open = await findOpenRuns(connected.client, stores.blobs);
      } catch (err) {
        refuse(
          `Cannot list the open runs on the Temporal server at ${address}: ${messageOf(err)}`,
          'Fix that and run the sweep again.',
        );
        return;
      }
      const where = stores.backend === 'postgres' ? 'in PostgreSQL' : `in ${config.dataDir}`;
      if (args.dryRun) {
        console.log(
          `Dry run, nothing removed: the sweep would remove memo entries, settled ledger rows and blobs ` +
            `last touched before ${before.toISOString()} (older than ${args.olderThan}) ${where}, ` +
            `keeping those of ${openRunsPhrase(open, { named: true })}.`,
        );
        return;
      }
      const removed = await sweepUnreferenced(stores, open, before);
      console.log(
        `${removedPhrase(removed)} older than ${args.olderThan} ${where} (kept those of ${openRunsPhrase(open)}).`,
      );
    } finally {
      await stores.close();
    }
  } finally {
    await connected.close();
  }
}

interface SweepArgs {
  olderThan: string;
  olderThanMs: number;
  dryRun: boolean;
}

/** The parsed arguments, `help`, or the message saying what is wrong with them. */
function parseCommandLine(argv: string[]): SweepArgs | 'help' | string {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        'older-than': { type: 'string' },
        'dry-run': { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (err) {
    // `--older-than` last, or followed by another option: say what it takes, not only that it is missing.
    return messageOf(err).includes('--older-than') ? MISSING_DURATION : messageOf(err);
  }
  if (values.help) return 'help';
  const olderThan = values['older-than'];
  try {
    return {
      olderThan: olderThan?.trim() ?? '',
      olderThanMs: parseDuration(olderThan),
      dryRun: values['dry-run'],
    };
  } catch (err) {
    if (err instanceof InvalidDurationError) return err.message;
    throw err;
  }
}

function removedPhrase(removed: SweepCounts): string {
  return (
    `Removed ${count(removed.memo, 'memo entry', 'memo entries')}, ` +
    `${count(removed.ledger, 'ledger row', 'ledger rows')}, ${count(removed.blobs, 'blob', 'blobs')}`
  );
}

function openRunsPhrase(open: OpenRuns, { named = false }: { named?: boolean } = {}): string {
  const shown = named ? [...open.workflowIds].slice(0, 5) : [];
  const more = open.workflowIds.size - shown.length;
  const names =
    !named || shown.length === 0 ? '' : ` (${shown.join(', ')}${more > 0 ? `, and ${more} more` : ''})`;
  return `${count(open.workflowIds.size, 'open run', 'open runs')}${names}`;
}

function count(n: number, one: string, many: string): string {
  return `${n} ${n === 1 ? one : many}`;
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

runMain(run);
