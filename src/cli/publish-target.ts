import './compose';
import { loadConfig } from '../config';
import { startReceiver } from '../publisher/receiver';
import { runMain } from '../lib/run-main';
import { openStores } from '../store/open';

/**
 * `npm run publish-target [port] [hostname...]`: a real HTTP publish target backed by the configured publication
 * database (DATA_DIR/publications.db, or PostgreSQL with DATABASE_URL). It echoes the Idempotency-Key: it dedupes
 * by it. It binds PUBLISH_TARGET_HOST (loopback by default; anything else needs PUBLISH_WEBHOOK_SECRET, and then
 * only signed requests are taken); the hostnames are the names senders use in the URL besides that address, e.g.
 * a compose service name. Point PUBLISH_WEBHOOK_URL at the printed URL to run the pipeline through the webhook
 * publisher.
 */
async function run(): Promise<void> {
  const config = loadConfig();
  const [portArg, ...hostnames] = process.argv.slice(2);
  const port = Number(portArg ?? 8787);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`Invalid port "${portArg}"`);
  const stores = await openStores(config);
  const receiver = await startReceiver(stores.publications(), {
    host: config.publishTargetHost,
    port,
    secret: config.publishSecret,
    hostnames,
  }).catch(async (err: unknown) => {
    await stores.close();
    throw err;
  });
  const signed = config.publishSecret === undefined ? 'unsigned requests' : 'signed requests only';
  console.log(`Publish target listening (${signed}): PUBLISH_WEBHOOK_URL=${receiver.url}`);
  const stop = (): void => {
    void receiver.close().finally(() => stores.close());
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

runMain(run);
