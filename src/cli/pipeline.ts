import './compose';
import { ConfigError, loadConfig } from '../config';
import { modelInfoOf } from '../model/choose';
import { startConfiguredTracing } from '../telemetry/tracing';
import { parseRunArgs } from './args';
import { runMain } from '../lib/run-main';
import { processDocuments } from '../runs/batch';
import { openStores } from '../store/open';
import { connectClient } from '../temporal/connection';

/** `npm run pipeline -- [--rerun] [--bulk] [--budget-usd N] <files or folders>`: the client only. Submits, waits for `npm run worker`, prints. */
async function run(): Promise<void> {
  const { paths, rerun, budget, bulk } = parseRunArgs(process.argv.slice(2));
  if (paths.length === 0) {
    throw new ConfigError(
      'give the files or folders to process: npm run pipeline -- [--rerun] samples/ notes.md',
    );
  }
  const config = loadConfig();
  // Tracing when configured, so a batch's start opens its trace. Not the SDK runtime: this process has no worker,
  // and an installed runtime would keep it alive after the batch.
  const tracing = startConfiguredTracing(config);
  const { client, close } = await connectClient(config);
  // The texts go where the workers read them: the shared PostgreSQL, or without it this machine's DATA_DIR.
  const stores = await openStores(config);
  try {
    const report = await processDocuments(client, config, stores.blobs, paths, {
      stream: process.stdout,
      rerun,
      ...(bulk === undefined ? {} : { bulk }),
      ...(budget === undefined ? {} : { budget }),
      pacing: stores.rateLimits,
      configuredModel: modelInfoOf(config.model),
    });
    process.exitCode = report.exitCode;
  } finally {
    await stores.close();
    await close();
    await tracing?.shutdown();
  }
}

runMain(run);
