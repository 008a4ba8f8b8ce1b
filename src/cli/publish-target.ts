import { loadConfig } from '../config';
import { startReceiver } from '../publisher/receiver';
import { runMain } from '../lib/run-main';
import { openStores } from '../store/open';

/**
 * `npm run publish-target [port]`: a real HTTP publish target backed by the configured publication database
 * (DATA_DIR/publications.db, or PostgreSQL with DATABASE_URL). It echoes the Idempotency-Key: it dedupes by it.
 * Point PUBLISH_WEBHOOK_URL at the printed URL to run the pipeline through the webhook publisher.
 */
async function run(): Promise<void> {
  const config = loadConfig();
  const port = Number(process.argv[2] ?? 8787);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new Error(`Invalid port "${process.argv[2]}"`);
  const stores = await openStores(config);
  const receiver = await startReceiver(stores.publications(), { port });
  console.log(`Publish target listening: PUBLISH_WEBHOOK_URL=${receiver.url}`);
  const stop = (): void => {
    void receiver.close().finally(() => stores.close());
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

runMain(run);
