import { loadConfig } from '../config';
import { PublicationStore } from '../publisher/publication-store';
import { startReceiver } from '../publisher/receiver';
import { runMain } from '../lib/run-main';

/**
 * `npm run publish-target [port]`: a real HTTP publish target backed by SQLite (DATA_DIR/publications.db).
 * Point PUBLISH_WEBHOOK_URL at the printed URL to run the pipeline through the webhook publisher.
 */
async function run(): Promise<void> {
  const config = loadConfig();
  const port = Number(process.argv[2] ?? 8787);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new Error(`Invalid port "${process.argv[2]}"`);
  const store = new PublicationStore(config.paths.publications);
  const receiver = await startReceiver(store, { port });
  console.log(`Publish target listening: PUBLISH_WEBHOOK_URL=${receiver.url}`);
  const stop = (): void => {
    void receiver.close().finally(() => store.close());
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

runMain(run);
