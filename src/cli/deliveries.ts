import { parseArgs } from 'node:util';
import { loadConfig } from '../config';
import { runMain } from '../lib/run-main';
import type { DeliveryLedger, LedgerEntry } from '../publisher/ledger';
import { openStores } from '../store/open';

const USAGE = [
  'Usage:',
  '  npm run deliveries                                   list webhook deliveries nobody knows the fate of',
  '  npm run deliveries -- resolve <key> delivered [--revision N]   the receiver has it: answer from the ledger',
  '  npm run deliveries -- resolve <key> unsent           the receiver does not have it: the next retry sends it',
].join('\n');

/**
 * `npm run deliveries`: the reconciliation side of the delivery ledger. A webhook delivery whose attempt sent the
 * POST and never recorded the answer (a crash, a stall, a lost reply) is an open claim; for a receiver that does
 * not dedupe by Idempotency-Key the publish step holds it (OPEN_DELIVERY_POLICY) until an operator has checked the
 * receiver and said whether it arrived. The held step looks at the ledger again every 30 s and goes on.
 */
async function run(): Promise<void> {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: { revision: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
  });
  if (values.help === true) {
    console.log(USAGE);
    return;
  }
  const stores = await openStores(loadConfig());
  try {
    const [command, key, verdict] = positionals;
    if (command === undefined || command === 'list') {
      printOpen(await stores.ledger.openClaims());
    } else if (
      command === 'resolve' &&
      key !== undefined &&
      (verdict === 'delivered' || verdict === 'unsent')
    ) {
      process.exitCode = (await resolve(stores.ledger, key, verdict, values.revision)) ? 0 : 1;
    } else {
      console.error(USAGE);
      process.exitCode = 2;
    }
  } finally {
    await stores.close();
  }
}

function printOpen(open: LedgerEntry[]): void {
  if (open.length === 0) {
    console.log('No open deliveries: every webhook delivery has a receipt or is known not to have arrived.');
    return;
  }
  console.log(
    `${open.length} open deliveries (sent, never answered): check the receiver for each key, then resolve.`,
  );
  for (const entry of open) {
    console.log(
      `  ${entry.idempotencyKey}  document ${entry.documentId}  attempts ${entry.attempts}  since ` +
        `${entry.updatedAt.toISOString()}  by ${entry.owner ?? '-'}${entry.lastError ? `  (${entry.lastError})` : ''}`,
    );
  }
}

/** Applies an operator's verdict; false (with a message) when the key has no open claim. */
async function resolve(
  ledger: DeliveryLedger,
  key: string,
  verdict: 'delivered' | 'unsent',
  revisionText = '1',
): Promise<boolean> {
  const open = (await ledger.openClaims()).find((e) => e.idempotencyKey === key);
  if (open === undefined) {
    console.error(`No open delivery under ${key}: \`npm run deliveries\` lists the open ones.`);
    return false;
  }
  const revision = Number(revisionText);
  if (!Number.isInteger(revision) || revision < 1) {
    console.error(`--revision must be a whole number from 1, not "${revisionText}"`);
    return false;
  }
  const done = await ledger.resolve(
    key,
    verdict === 'unsent'
      ? 'unsent'
      : { delivered: { documentId: open.documentId, revision, duplicate: true } },
  );
  console.log(
    verdict === 'unsent'
      ? `${key}: marked not delivered; the held publish step sends it on its next try.`
      : `${key}: marked delivered (revision ${revision}); the held publish step completes on its next try.`,
  );
  return done;
}

runMain(run);
