import { pipeline } from './compose';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { loadConfig } from '../config';
import { runMain, UserFacingError } from '../lib/run-main';
import { InvalidDurationError, parseDuration } from '../runs/retention';
import { configuredEndpoint, connectClient } from '../temporal/connection';
import {
  bundleForCheck,
  checkRuns,
  describeCheck,
  namespaceRetentionMs,
  patchCallsIn,
  runsQuery,
} from '../temporal/replay-check';

const WORKFLOWS = path.dirname(pipeline.workflowsPath);
const FALLBACK_WINDOW = '7d';
const USAGE = `Usage: npm run check-replay -- [--since <duration>] [--workflows <path>]

Replays the histories of the task queue's open runs, and of those closed within the window, against the
workflow code of this working tree, on the server at TEMPORAL_ADDRESS (else the embedded server's port,
EMBEDDED_TEMPORAL_PORT). Prints the runs that would break, and for each patched() of the code whether a run
still needs its old branch. Exits 1 when a run would break. Run it before every deploy (docs/deploy.md).

  --since <duration>   closed runs to include, e.g. 7d, 12h (default: the namespace's retention, else ${FALLBACK_WINDOW})
  --workflows <path>   the workflow code to check (default: workflows/)
  -h, --help           show this text`;

/** `npm run check-replay`: may this code be deployed, and may this `patched()` go? */
async function run(): Promise<void> {
  const { values } = parseCommandLine();
  if (values.help === true) {
    console.log(USAGE);
    return;
  }
  const config = loadConfig();
  // The replay worker's state changes, and core's warning for each run that fails to replay, which the lines
  // below already name: errors only.
  Runtime.install({
    logger: new DefaultLogger('ERROR'),
    telemetryOptions: { logging: { filter: { core: 'ERROR', other: 'ERROR' }, forward: {} } },
  });
  // Unset TEMPORAL_ADDRESS means the embedded server, as for npm start: on its port.
  const endpoint =
    config.temporal.address === undefined
      ? { ...configuredEndpoint(config), address: `localhost:${config.embeddedPort}` }
      : configuredEndpoint(config);
  const workflowsPath = path.resolve(values.workflows ?? WORKFLOWS);
  const sinceGiven = values.since === undefined ? undefined : sinceMs(values.since);
  const { client, dataConverter, close } = await connectClient(config, {
    endpoint,
    connectTimeout: '5 seconds',
  });
  try {
    const retention = values.since === undefined ? await namespaceRetentionMs(client) : undefined;
    const [windowMs, window] =
      values.since !== undefined && sinceGiven !== undefined
        ? [sinceGiven, values.since]
        : retention !== undefined
          ? [retention, `${days(retention)} (the namespace's retention)`]
          : [sinceMs(FALLBACK_WINDOW), FALLBACK_WINDOW];
    const query = runsQuery(config.taskQueue, new Date(Date.now() - windowMs));
    console.log(
      `Replaying the runs of task queue ${config.taskQueue} on ${endpoint.address} (namespace ${endpoint.namespace}), ` +
        `open or closed in the last ${window}, against ${path.relative(process.cwd(), workflowsPath) || '.'}.`,
    );
    const check = await checkRuns(client, {
      query,
      bundle: await bundleForCheck(workflowsPath, dataConverter),
      patchCalls: patchCallsIn(workflowsPath),
      dataConverter,
    });
    for (const line of describeCheck(check)) console.log(line);
    if (check.broken.length > 0) process.exitCode = 1;
  } finally {
    await close();
  }
}

function parseCommandLine() {
  try {
    return parseArgs({
      options: {
        since: { type: 'string' },
        workflows: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      allowPositionals: false,
    });
  } catch (err) {
    throw new UserFacingError(`${err instanceof Error ? err.message : String(err)}\n\n${USAGE}`);
  }
}

function sinceMs(text: string): number {
  try {
    return parseDuration(text);
  } catch (err) {
    if (err instanceof InvalidDurationError) {
      throw new UserFacingError(err.message.replaceAll('--older-than', '--since'));
    }
    throw err;
  }
}

function days(ms: number): string {
  const d = ms / 86_400_000;
  return Number.isInteger(d) ? `${d}d` : `${Math.round(ms / 3_600_000)}h`;
}

runMain(run);
