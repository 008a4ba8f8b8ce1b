/**
 * The delivery ledger's claims know whose they are, on both backends: a stale attempt's late answer never changes
 * a claim that moved on, an operator's verdict settles every run held on the claim, a newer version supersedes an
 * older one's open claim (an edit, then a revert, publishes what the file says now), lookups count only when they
 * name the key and the version, and "may this POST still be under way" is read off the store's clock.
 *
 * The receiver is a local HTTP server that does not dedupe (every POST is an effect, as the hold policy and the
 * lookup exist for), with a lookup by key in the documented shape (docs/deploy.md, the lookup by key), or one that
 * answers every GET as a single-page app or a missing route would. The evidence is its own log of effects.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, it } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { FailureType } from '../src/contract';
import type { DeliveryLedger } from '../src/publisher/ledger';
import { resolveDelivery } from '../src/publisher/reconcile';
import type { Publication } from '../src/publisher/types';
import { deliveryOf } from '../src/publisher/webhook-publisher';
import {
  answerLookup,
  closeServer,
  ledgerBackends,
  listenOnLoopback,
  lookupKeyOf,
  openClaimOf,
  webhookPublisher,
} from './helpers';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();
const NO_ABORT = new AbortController().signal;

const BACKENDS = ledgerBackends(defer);

/** How the receiver's GET /publications/{key} answers. */
type LookupMode =
  /** The documented shape: 200 naming the key and the version it delivered, 404 naming the key. */
  | 'keyed'
  /** 200 with an HTML page to every GET, as a single-page app's fallback does. */
  | 'spa'
  /** 404 with a body that names no key to every GET, as a server without the route does. */
  | 'no-route';

interface Effect {
  key: string;
  textRef: string;
  /** The publication's summary step field, as the body carried it. */
  summary: unknown;
}

/**
 * A receiver that does not dedupe: every POST that reaches it is an effect, logged. `loseAnswers` of the first
 * POSTs have their answer lost after the effect (the connection is cut); `answerWith` answers the next POSTs with
 * that status instead (after the effect, as a POST-redirect-GET does).
 */
async function receiver(mode: LookupMode = 'keyed') {
  const effects: Effect[] = [];
  let loseAnswers = 0;
  let answerWith: number | undefined;
  let gets = 0;
  const server = http.createServer((req, res) => {
    if (req.method === 'GET') {
      req.resume();
      gets += 1;
      if (mode === 'spa')
        return void res.writeHead(200, { 'content-type': 'text/html' }).end('<html></html>');
      if (mode === 'no-route') return void res.writeHead(404).end(JSON.stringify({ error: 'not found' }));
      const key = lookupKeyOf(req);
      const effect = effects.find((e) => e.key === key);
      return answerLookup(
        res,
        key,
        effect && { revision: effects.indexOf(effect) + 1, textRef: effect.textRef },
      );
    }
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString('utf8')));
    req.on('end', () => {
      const publication = JSON.parse(body) as Publication;
      const key = String(req.headers['idempotency-key']);
      effects.push({ key, textRef: publication.textRef, summary: publication.summary });
      if (loseAnswers > 0) {
        loseAnswers -= 1;
        return void res.socket?.destroy();
      }
      if (answerWith !== undefined)
        return void res.writeHead(answerWith, { location: '/publications/done' }).end();
      res.writeHead(201).end(JSON.stringify({ revision: effects.length }));
    });
  });
  const origin = await listenOnLoopback(server);
  defer(() => closeServer(server));
  return {
    url: `${origin}/publications`,
    lookupUrl: `${origin}/publications/{key}`,
    effects,
    gets: () => gets,
    loseNext(count = 1) {
      loseAnswers = count;
    },
    answerNextWith(status: number | undefined) {
      answerWith = status;
    },
    /** What a reader of the receiver sees now: the last effect's version. */
    current: () => effects.at(-1)?.textRef,
  };
}

const version = (n: number): string => `sha256:${String(n).repeat(64)}`;

function publication(documentId: string, textRef: string, summary = 'A summary.'): Publication {
  return {
    documentId,
    title: 'A title',
    textRef,
    summary,
    tags: ['checkpoints'],
    model: { provider: 'offline', model: 'extractive-wink-nlp' },
  };
}

const isFailure = (type: string) => (err: unknown) => {
  assert.ok(err instanceof ApplicationFailure, String(err));
  assert.equal(err.type, type, err.message);
  return true;
};

for (const backend of BACKENDS) {
  describe(`delivery claims that know whose they are (${backend.name})`, () => {
    it("a stale attempt's late verdict, note or answer never changes the claim that replaced it (case 4)", async () => {
      const ledger = await backend.ledger();
      const d = deliveryOf(publication(`doc-${randomUUID()}`, version(1)), 'run-1:publish', 1_000);
      await ledger.claim(d, 'stalled-attempt');
      const seen = await openClaimOf(ledger, d.idempotencyKey);
      // The attempt that replaced the stalled one took the claim over and is sending.
      assert.equal(await ledger.retake(seen, 'replacing-attempt'), true);
      // The stalled attempt's lookup comes back late with a 404, and its POST with a timeout, then an answer.
      assert.equal(
        await ledger.resolve(seen, 'unsent'),
        false,
        'a late 404 reset the claim that replaced it',
      );
      await ledger.note(d.idempotencyKey, 'stalled-attempt', 'no answer within 1000 ms');
      await ledger.unsent(d.idempotencyKey, 'stalled-attempt', 'ECONNREFUSED');
      await ledger.delivered(
        d.idempotencyKey,
        'stalled-attempt',
        { documentId: d.documentId, revision: 1, duplicate: false },
        undefined,
      );
      const now = await openClaimOf(ledger, d.idempotencyKey);
      assert.deepEqual([now.owner, now.attempts, now.lastError], ['replacing-attempt', 2, null]);
      assert.equal(await ledger.retake(seen, 'another'), false, 'a stale view took the claim over');
    });

    it("an operator's verdict settles every run held on the claim: the held run completes without a POST (case 1)", async () => {
      const ledger = await backend.ledger();
      const target = await receiver();
      const doc = publication(`doc-${randomUUID()}`, version(1));
      const publisher = holding(ledger, target.url);
      target.loseNext();
      await assert.rejects(publisher.publish(doc, 'run-1:publish', NO_ABORT));
      // Run 2 of the same version (a resubmission) finds run 1's open claim once its POST cannot be under way.
      await sleepPastInFlight();
      await assert.rejects(
        publisher.publish(doc, 'run-2:publish', NO_ABORT),
        isFailure(FailureType.DeliveryHeld),
      );
      const verdict = await resolveDelivery(
        ledger,
        'run-1:publish',
        { kind: 'delivered', revision: 1 },
        { requestTimeoutMs: TIMEOUT_MS },
      );
      assert.equal(verdict.ok, true, verdict.message);
      const receipt = await publisher.publish(doc, 'run-2:publish', NO_ABORT);
      assert.equal(receipt.duplicate, true);
      assert.deepEqual(
        target.effects.map((e) => e.key),
        ['run-1:publish'],
        'the held run sent the version again under its own key',
      );
      assert.deepEqual(await ledger.openClaims(), []);
    });

    it('an edit, then a revert, publishes what the file says now: the stale claim of the old version is not inherited (case 7)', async () => {
      const ledger = await backend.ledger();
      const target = await receiver();
      const id = `doc-${randomUUID()}`;
      const publisher = holding(ledger, target.url, target.lookupUrl);
      // Version 1's answer is lost: its claim stays open (a lookup would say it landed).
      target.loseNext();
      await assert.rejects(publisher.publish(publication(id, version(1)), 'run-1:publish', NO_ABORT));
      // Edited: version 2 goes out.
      await publisher.publish(publication(id, version(2)), 'run-2:publish', NO_ABORT);
      await sleepPastInFlight();
      // Reverted: version 1 again, in run 3. The receiver shows version 2; run 3 must publish version 1.
      const receipt = await publisher.publish(publication(id, version(1)), 'run-3:publish', NO_ABORT);
      assert.equal(receipt.duplicate, false, 'run 3 reported the stale version-1 delivery as its own');
      assert.equal(target.current(), version(1), "the receiver does not show the file's current version");
      assert.deepEqual(
        target.effects.map((e) => e.key),
        ['run-1:publish', 'run-2:publish', 'run-3:publish'],
      );
    });

    it("a stale run's older version, published late, does not supersede a newer run's open claim (case 7)", async () => {
      const ledger = await backend.ledger();
      const id = `doc-${randomUUID()}`;
      const delivery = (key: string, n: number, scheduledAt: number) => ({
        ...deliveryOf({ ...publication(id, version(n)), scheduledAt }, key, 0),
        inFlightMs: 0,
      });
      // Run 2 sends version 2 and loses the answer: its claim stays open.
      assert.equal((await ledger.claim(delivery('run-2:publish', 2, 2_000), 'run-2-attempt')).kind, 'fresh');
      await ledger.note('run-2:publish', 'run-2-attempt', 'no answer within 1000 ms');
      // Run 1, scheduled before it (version 1, a stale run), publishes late.
      assert.equal((await ledger.claim(delivery('run-1:publish', 1, 1_000), 'run-1-attempt')).kind, 'fresh');
      const receipt = { documentId: id, revision: 1, duplicate: false, superseded: true };
      await ledger.delivered('run-1:publish', 'run-1-attempt', receipt, undefined);
      // Run 3 resubmits version 2: run 2's open claim is still the delivery of that version.
      const claim = await ledger.claim(delivery('run-3:publish', 2, 3_000), 'run-3-attempt');
      assert.equal(claim.kind, 'open', "a stale run's late delivery superseded the newer version's claim");
      assert.equal(claim.kind === 'open' ? claim.entry.idempotencyKey : undefined, 'run-2:publish');
    });

    it('a lookup that answers 200 to everything (a single-page app) settles nothing: held, not reported published (case 8)', async () => {
      const ledger = await backend.ledger();
      const target = await receiver('spa');
      const doc = publication(`doc-${randomUUID()}`, version(1));
      const publisher = holding(ledger, target.url, target.lookupUrl);
      // The POST never arrived (the connection is cut before the receiver reads it): no effect.
      const refused = await cutBeforeEffect();
      const lost = holding(ledger, refused);
      await assert.rejects(lost.publish(doc, 'run-1:publish', NO_ABORT));
      await sleepPastInFlight();
      await assert.rejects(
        publisher.publish(doc, 'run-1:publish', NO_ABORT),
        isFailure(FailureType.DeliveryHeld),
      );
      assert.ok(target.gets() >= 1, 'the lookup was not asked');
      assert.deepEqual(target.effects, []);
      assert.equal((await openClaimOf(ledger, 'run-1:publish')).state, 'claimed');
    });

    it('a 404 from a lookup that names no key (no such route) is not taken for absence: an earlier delivery is not sent again (case 3)', async () => {
      const ledger = await backend.ledger();
      const target = await receiver('no-route');
      const doc = publication(`doc-${randomUUID()}`, version(1));
      const publisher = holding(ledger, target.url, target.lookupUrl);
      target.loseNext();
      await assert.rejects(publisher.publish(doc, 'run-1:publish', NO_ABORT));
      await sleepPastInFlight();
      await assert.rejects(
        publisher.publish(doc, 'run-2:publish', NO_ABORT),
        isFailure(FailureType.DeliveryHeld),
      );
      assert.deepEqual(
        target.effects.map((e) => e.key),
        ['run-1:publish'],
        'the delivered version was sent again',
      );
    });

    it('a 303 after the receiver applied the POST leaves the claim open: a resubmission never POSTs it again (case 6)', async () => {
      const ledger = await backend.ledger();
      const target = await receiver();
      const doc = publication(`doc-${randomUUID()}`, version(1));
      const publisher = holding(ledger, target.url);
      target.answerNextWith(303);
      await assert.rejects(
        publisher.publish(doc, 'run-1:publish', NO_ABORT),
        isFailure(FailureType.PublishRejected),
      );
      target.answerNextWith(undefined);
      await sleepPastInFlight();
      // Resubmitted, as the failure says to once the address is fixed: held on the open claim, not sent.
      await assert.rejects(
        publisher.publish(doc, 'run-2:publish', NO_ABORT),
        isFailure(FailureType.DeliveryHeld),
      );
      assert.deepEqual(
        target.effects.map((e) => e.key),
        ['run-1:publish'],
      );
    });
  });
}

describe('delivery claims on a skewed clock (PostgreSQL)', () => {
  it("judges a claim's age by the store's clock: a worker 60 s ahead does not take a fresh claim for an old one (case 5)", async () => {
    const backend = BACKENDS.find((b) => b.name === 'PostgreSQL');
    assert.ok(backend !== undefined);
    const ledger = await backend.ledger();
    const target = await receiver();
    const doc = publication(`doc-${randomUUID()}`, version(1));
    // A stalled attempt claimed the delivery a moment ago; its POST has not arrived (yet).
    await ledger.claim(deliveryOf(doc, 'run-1:publish', 10_000), 'stalled-attempt');
    const publisher = webhookPublisher(defer, target.url, {
      ledger,
      policy: 'hold',
      timeoutMs: 10_000,
      lookupUrl: target.lookupUrl,
    });
    const realNow = Date.now;
    Date.now = () => realNow() + 60_000;
    try {
      await assert.rejects(
        publisher.publish(doc, 'run-1:publish', NO_ABORT),
        isFailure(FailureType.DeliveryHeld),
      );
    } finally {
      Date.now = realNow;
    }
    assert.deepEqual(
      target.effects,
      [],
      "sent under the stalled attempt's key while its POST may still land",
    );
  });
});

/**
 * The POST's timeout of the publishers here: a claim may have its POST under way for it and a 5 s grace. Long
 * enough for a busy machine's receiver to read a POST before its sender gives up (200 ms was not, in a CI run).
 */
const TIMEOUT_MS = 1_000;

/** A webhook publisher that holds what it cannot settle (OPEN_DELIVERY_POLICY=hold), with a lookup if given. */
function holding(ledger: DeliveryLedger, url: string, lookupUrl?: string) {
  return webhookPublisher(defer, url, { ledger, policy: 'hold', timeoutMs: TIMEOUT_MS, lookupUrl });
}

/** Waits until a claim sent by those publishers is past its POST's timeout and grace, by any clock. */
async function sleepPastInFlight(): Promise<void> {
  await sleep(deliveryOf(publication('x', version(1)), 'x', TIMEOUT_MS).inFlightMs + 100);
}

/** A server that cuts every connection once the request's head is read: nothing reaches the receiver. */
async function cutBeforeEffect(): Promise<string> {
  const server = http.createServer((req) => req.socket.destroy());
  const origin = await listenOnLoopback(server);
  defer(() => closeServer(server));
  return `${origin}/publications`;
}
