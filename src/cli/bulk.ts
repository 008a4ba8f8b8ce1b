import './compose';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import { WorkflowNotFoundError } from '@temporalio/client';
import type { Client } from '@temporalio/client';
import { batchProgressQuery } from '../workflow/queries';
import type { BulkProgress } from '../contract/batch';
import { loadConfig } from '../config';
import { runMain, UserFacingError } from '../lib/run-main';
import { bulkLine } from '../runs/batch-progress';
import { bulkLines } from '../runs/result-table';
import { openStores } from '../store/open';
import { connectClient } from '../temporal/connection';

const USAGE = [
  'Usage:',
  "  npm run bulk -- status <batch id>   the batch's provider batches: their state, counts and cost so far",
  '  npm run bulk -- cancel <batch id>   cancel the batch and its provider batches (what they answered is kept)',
  '',
  'The batch ID is the one `npm start -- --bulk` and `npm run pipeline -- --bulk` print: "Batch batch-...".',
].join('\n');

/** How long `cancel` waits for the batch to cancel its provider batches and close. */
const CANCEL_WAIT_MS = 120_000;

/**
 * `npm run bulk`: bulk mode's provider batches (docs/bulk.md), as the batch workflow keeps them. `cancel` cancels
 * the batch: the workflow cancels its provider batches at the provider, waits for them to end, and keeps in the
 * memo what they answered before the cancel took (those answers are paid).
 */
async function run(): Promise<void> {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: { help: { type: 'boolean', short: 'h' } },
  });
  const [command, batchId] = positionals;
  if (values.help === true) {
    console.log(USAGE);
    return;
  }
  if ((command !== 'status' && command !== 'cancel') || batchId === undefined) {
    console.error(USAGE);
    process.exitCode = 2;
    return;
  }
  const config = loadConfig();
  const { client, close } = await connectClient(config);
  try {
    if (command === 'cancel') await cancel(client, batchId);
    else printBulk(await bulkOf(client, batchId), batchId);
  } finally {
    await close();
  }
}

async function bulkOf(client: Client, batchId: string): Promise<BulkProgress | undefined> {
  try {
    return (await client.workflow.getHandle(batchId).query(batchProgressQuery)).bulk;
  } catch (err) {
    if (err instanceof WorkflowNotFoundError)
      throw new UserFacingError(
        `no batch is called "${batchId}": the ID is the one npm start printed ("Batch batch-...")`,
      );
    throw err;
  }
}

function printBulk(bulk: BulkProgress | undefined, batchId: string): void {
  if (bulk === undefined) {
    console.log(`${batchId} does not run in bulk mode.`);
    return;
  }
  console.log(bulkLine(bulk)?.line);
  for (const line of bulkLines(bulk)) console.log(line);
}

async function cancel(client: Client, batchId: string): Promise<void> {
  const handle = client.workflow.getHandle(batchId);
  const before = await bulkOf(client, batchId);
  if (before === undefined)
    throw new UserFacingError(`${batchId} does not run in bulk mode: nothing to cancel at a provider`);
  await handle.cancel();
  console.log(
    `Cancelling ${batchId}: its provider batches are cancelled at the provider, and what they answered is kept.`,
  );
  const deadline = Date.now() + CANCEL_WAIT_MS;
  for (;;) {
    const { status } = await handle.describe();
    if (status.name !== 'RUNNING') {
      console.log(`${batchId}: ${status.name.toLowerCase()}.`);
      break;
    }
    if (Date.now() > deadline) {
      console.log(
        `${batchId} is still cancelling after ${CANCEL_WAIT_MS / 1000} s (a provider takes up to 10 minutes to ` +
          'cancel a batch, and a worker must be running); npm run bulk -- status shows where it is.',
      );
      break;
    }
    await sleep(1_000);
  }
  const stores = await openStores(loadConfig());
  try {
    const claims = await stores.bulkClaims.ofBatch(batchId);
    for (const claim of claims)
      console.log(
        `  ${claim.providerBatchId ?? '(not created)'}: ${claim.requests.length} request(s), ` +
          `${claim.collected === null ? 'not collected' : `${claim.collected.answered} answer(s) kept`}`,
      );
  } finally {
    await stores.close();
  }
}

runMain(run);
