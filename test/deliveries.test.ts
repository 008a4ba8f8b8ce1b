/** `npm run deliveries`: listing open deliveries and settling one, as an operator does after checking the receiver. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { describeOpen, resolveDelivery } from '../src/publisher/reconcile';
import { scratchLedger } from './helpers';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();
const TIMEOUT = { requestTimeoutMs: 1_000 };
const VERSION = `sha256:${'a'.repeat(64)}`;
/**
 * Judged as a minute later: a claim's age is the store's to say, so the request timeout is made a minute shorter
 * instead (a claim made now is then past its POST's timeout and grace).
 */
const A_MINUTE_LATER = { requestTimeoutMs: TIMEOUT.requestTimeoutMs - 60_000 };

async function openClaim() {
  const ledger = scratchLedger(defer);
  const delivery = {
    idempotencyKey: 'run-1:publish',
    workflowId: 'document-d',
    documentId: 'd',
    version: VERSION,
    inFlightMs: 0,
  };
  await ledger.claim(delivery, 'worker-a');
  return { ledger, key: delivery.idempotencyKey };
}

describe('npm run deliveries', () => {
  it('lists a claim whose POST may still be under way as sending, and refuses to settle it yet', async () => {
    const { ledger, key } = await openClaim();
    assert.match(describeOpen(await ledger.openClaims(), TIMEOUT).join('\n'), /run-1:publish .* sending now/);
    const early = await resolveDelivery(ledger, key, { kind: 'unsent' }, TIMEOUT);
    assert.equal(early.ok, false);
    assert.match(early.message, /may still be under way/);
    assert.equal((await ledger.openClaims()).length, 1, 'an in-flight POST was marked unsent');

    assert.match(describeOpen(await ledger.openClaims(), A_MINUTE_LATER).join('\n'), /sent, never answered/);
    const settled = await resolveDelivery(ledger, key, { kind: 'unsent' }, A_MINUTE_LATER);
    assert.deepEqual(settled.ok, true, settled.message);
    assert.deepEqual(await ledger.openClaims(), []);
  });

  it('records the revision the operator gives, and says "nothing resolved" when the claim was settled meanwhile', async () => {
    const { ledger, key } = await openClaim();
    const options = A_MINUTE_LATER;
    // A retry settles it between the operator's look and the verdict.
    const racing = Object.assign(Object.create(ledger) as typeof ledger, {
      resolve: () => Promise.resolve(false),
    });
    const raced = await resolveDelivery(racing, key, { kind: 'delivered', revision: 3 }, options);
    assert.equal(raced.ok, false);
    assert.match(raced.message, /nothing resolved/);
    assert.doesNotMatch(raced.message, /marked/);

    const done = await resolveDelivery(ledger, key, { kind: 'delivered', revision: 3 }, options);
    assert.equal(done.ok, true, done.message);
    assert.deepEqual(
      await ledger.claim(
        { idempotencyKey: key, workflowId: 'document-d', documentId: 'd', version: VERSION, inFlightMs: 0 },
        'worker-b',
      ),
      {
        kind: 'delivered',
        receipt: { documentId: 'd', revision: 3, duplicate: true },
      },
    );
  });
});
