import './compose';
import { parseArgs } from 'node:util';
import { loadConfig } from '../config';
import type { Config } from '../config';
import { connectClient } from '../temporal/connection';
import { deliverySettledSignal } from '../workflow/queries';
import { runMain } from '../lib/run-main';
import { describeOpen, resolveDelivery } from '../publisher/reconcile';
import type { Verdict } from '../publisher/reconcile';
import { openStores } from '../store/open';

const USAGE = [
  'Usage:',
  '  npm run deliveries                                   list webhook deliveries nobody knows the fate of',
  '  npm run deliveries -- resolve <key> delivered --revision N   the receiver has revision N: answer from it',
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
  const config = loadConfig();
  const options = { requestTimeoutMs: config.publishRequestTimeoutMs };
  const [command, key, verdictName] = positionals;
  const verdict = verdictOf(verdictName, values.revision);
  if (!(command === undefined || command === 'list' || (command === 'resolve' && key !== undefined))) {
    console.error(USAGE);
    process.exitCode = 2;
    return;
  }
  if (command === 'resolve' && typeof verdict === 'string') {
    console.error(verdict);
    process.exitCode = 2;
    return;
  }
  const stores = await openStores(config);
  try {
    if (command === 'resolve' && key !== undefined && typeof verdict !== 'string') {
      const { ok, message, workflowId } = await resolveDelivery(stores.ledger, key, verdict, options);
      (ok ? console.log : console.error)(message);
      if (workflowId !== undefined) await wake(config, workflowId);
      process.exitCode = ok ? 0 : 1;
    } else {
      for (const line of describeOpen(await stores.ledger.openClaims(), options)) console.log(line);
    }
  } finally {
    await stores.close();
  }
}

/**
 * Tells the document's held run to look at the ledger now rather than at its next timer (up to 5 minutes away).
 * Without a Temporal server to tell, it only says when the run looks again by itself.
 */
async function wake(config: Config, workflowId: string): Promise<void> {
  try {
    const { client, close } = await connectClient(config, { connectTimeout: '5 seconds' });
    try {
      await client.workflow.getHandle(workflowId).signal(deliverySettledSignal);
      console.log(`Told ${workflowId}: its publish step looks at the ledger now.`);
    } finally {
      await close();
    }
  } catch {
    console.log(
      `${workflowId} was not told (no Temporal server answered): its publish step looks again within 5 min.`,
    );
  }
}

/** The verdict the command line gives, or what is wrong with it. */
function verdictOf(name: string | undefined, revision: string | undefined): Verdict | string {
  if (name === 'unsent') return { kind: 'unsent' };
  if (name !== 'delivered') return USAGE;
  if (revision === undefined)
    return 'delivered needs --revision N: the revision the receiver holds for the document (its receipt says it)';
  const n = Number(revision);
  if (!Number.isInteger(n) || n < 1) return `--revision must be a whole number from 1, not "${revision}"`;
  return { kind: 'delivered', revision: n };
}

runMain(run);
