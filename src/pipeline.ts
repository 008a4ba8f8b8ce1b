import { Client, Connection } from '@temporalio/client';
import { processDocuments } from './batch';
import { dataConverterFor } from './codec';
import { loadConfig } from './config';
import { runMain } from './run-main';

/** `npm run pipeline -- <files or folders>`: the client only. Submits, waits for `npm run worker`, prints. */
async function run(): Promise<void> {
  const paths = process.argv.slice(2);
  if (paths.length === 0) {
    throw new Error('Give the files or folders to process: npm run pipeline -- samples/ notes.md');
  }
  const config = loadConfig();
  const address = config.temporalAddress ?? 'localhost:7233';
  const connection = await Connection.connect({ address });
  try {
    const client = new Client({
      connection,
      namespace: config.namespace,
      dataConverter: dataConverterFor(config),
    });
    const outcomes = await processDocuments(client, config, paths);
    if (outcomes.some((o) => o.error !== undefined)) process.exitCode = 1;
  } finally {
    await connection.close();
  }
}

runMain(run);
