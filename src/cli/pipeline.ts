import { loadConfig } from '../config';
import { runMain } from '../lib/run-main';
import { processDocuments } from '../runs/batch';
import { exitCodeFor } from '../runs/result-table';
import { openStores } from '../store/open';
import { connectClient } from '../temporal/connection';

/** `npm run pipeline -- <files or folders>`: the client only. Submits, waits for `npm run worker`, prints. */
async function run(): Promise<void> {
  const paths = process.argv.slice(2);
  if (paths.length === 0) {
    throw new Error('Give the files or folders to process: npm run pipeline -- samples/ notes.md');
  }
  const config = loadConfig();
  const { client, close } = await connectClient(config);
  // The texts go where the workers read them: the shared PostgreSQL, or without it this machine's DATA_DIR.
  const stores = await openStores(config);
  try {
    const outcomes = await processDocuments(client, config, stores.blobs, paths);
    process.exitCode = exitCodeFor(outcomes);
  } finally {
    await stores.close();
    await close();
  }
}

runMain(run);
