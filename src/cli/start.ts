import './compose';
import { loadConfig, SAMPLES_DIR } from '../config';
import { startCrossReferenceServer } from '../../demo/cross-reference-server';
import { runMain } from '../lib/run-main';
import { processDocuments } from '../runs/batch';
import { connectClient, connectWorker } from '../temporal/connection';
import { connectOrStartTemporal, webUiLine } from '../temporal/choose-server';
import { parseRunArgs } from './args';
import { quietSdkLogs } from '../temporal/runtime';
import { wirePipelineWorker } from '../temporal/serve';

/**
 * `npm start [-- --rerun] [files or folders]`: the whole job in one process. Finds or starts a Temporal server (embedded,
 * with its database in the data folder), runs a worker, submits the documents (the shipped samples by default)
 * and prints the results. Kill it at any point and run it again: finished steps are not repeated.
 */
async function run(): Promise<void> {
  const since = Date.now();
  const loaded = loadConfig();
  // AGENT=on with no receiver named: the related step files its cross-references at the demo's, in this process.
  const receiver =
    loaded.agent !== undefined && loaded.agentToolUrl === undefined
      ? await startCrossReferenceServer()
      : undefined;
  const config = receiver === undefined ? loaded : { ...loaded, agentToolUrl: receiver.url };
  if (receiver !== undefined)
    console.log(`Agent steps on: cross-references go to the demo's receiver at ${receiver.url}`);
  const tracing = quietSdkLogs(config);
  const args = parseRunArgs(process.argv.slice(2));
  const paths = args.paths.length > 0 ? args.paths : [SAMPLES_DIR];
  const target = await connectOrStartTemporal(config);
  console.log(`Temporal: ${target.address} (${target.origin}), namespace ${target.namespace}`);
  const { client, dataConverter, close: closeClient } = await connectClient(config, { endpoint: target });
  const nativeConnection = await connectWorker(config, target);
  let closeWorker = async (): Promise<void> => {};
  let interrupted = false;
  let finished = false;
  // Stops following the batch when the worker stops first (Ctrl-C, a worker failure): see the finally below.
  const follow = new AbortController();
  let following: Promise<unknown> = Promise.resolve();
  try {
    const checkpoint = target.origin === 'embedded' ? config.paths.temporal : 'the Temporal server';
    // A second Ctrl-C does not wait: the steps cut off rerun on the next start, the server stops on exit.
    const wired = await wirePipelineWorker(config, nativeConnection, target.namespace, {
      dataConverter,
      announce: (line, signal) => {
        // Ctrl-C ends with 130 once the steps under way are recorded; a SIGTERM (a deploy) as a stopped job does.
        interrupted = signal === 'SIGINT';
        console.log(
          `\n${line}. Finished steps are recorded in ${checkpoint}; run npm start again to resume.`,
        );
      },
    });
    closeWorker = wired.close;
    const { worker, deps, stores } = wired;
    console.log(
      `Worker ${worker.options.identity}: model ${deps.model.info.provider}/${deps.model.info.model}, ` +
        `publisher ${deps.publisher.kind}, payloads ${dataConverter ? 'encrypted' : 'in plaintext'}, ` +
        `state in ${stores.backend === 'postgres' ? 'PostgreSQL' : config.dataDir}`,
    );
    let outcomes;
    const report = processDocuments(client, config, stores.blobs, paths, {
      since,
      stream: process.stdout,
      rerun: args.rerun,
      ...(args.bulk === undefined ? {} : { bulk: true }),
      ...(args.budget === undefined ? {} : { budget: args.budget }),
      pacing: stores.rateLimits,
      configuredModel: deps.model.info,
      signal: follow.signal,
    });
    following = report.catch(() => undefined);
    try {
      outcomes = await worker.runUntil(report);
    } catch (err) {
      if (!interrupted) throw err;
      return;
    }
    process.exitCode = outcomes.exitCode;
    finished = true;
  } finally {
    // No call to Temporal may outlive the client's connection: one still out when the server stops would retry
    // on the closed channel and crash the process. Cancel them and wait until the follow has let go.
    follow.abort();
    await following;
    await closeWorker();
    await nativeConnection.close();
    await closeClient();
    await target.close();
    await receiver?.close();
    await tracing?.shutdown();
    // Last, once the embedded server is stopped: a link only while something serves it.
    const ui = finished ? await webUiLine(target, config) : undefined;
    if (ui !== undefined) console.log(ui);
    if (interrupted) process.exit(130);
  }
}

runMain(run);
