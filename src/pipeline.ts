import { Client, Connection } from '@temporalio/client';
import { processDocuments } from './batch';
import { dataConverterFor } from './codec';
import { loadConfig } from './config';
import { temporalConnection } from './connection';
import { runMain } from './run-main';

/** `npm run pipeline -- <files or folders>`: the client only. Submits, waits for `npm run worker`, prints. */
async function run(): Promise<void> {
  const paths = process.argv.slice(2);
  if (paths.length === 0) {
    throw new Error('Give the files or folders to process: npm run pipeline -- samples/ notes.md');
  }
  const config = loadConfig();
  const target = temporalConnection();
  const connection = await Connection.connect({
    address: target.address ?? 'localhost:7233',
    ...target.secure,
  });
  try {
    const client = new Client({
      connection,
      namespace: target.namespace ?? config.namespace,
      dataConverter: dataConverterFor(config),
    });
    const outcomes = await processDocuments(client, config, paths);
    if (outcomes.some((o) => o.error !== undefined)) process.exitCode = 1;
  } finally {
    await connection.close();
  }
}

runMain(run);
