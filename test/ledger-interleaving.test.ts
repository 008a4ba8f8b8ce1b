/**
 * Runs of one document interleaved with faults, on both backends: edits, reverts and reruns with another model
 * (each a new run, under its own key), runs abandoned after a failed try and submitted again, answers lost after the effect, requests lost before it, POSTs that stall past
 * their timeout and land late, and a lookup that answers, times out or cuts the connection. Each run publishes
 * until it is settled, as the workflow does: retries after a failure, and an operator who, when a delivery is held,
 * looks at the receiver and says what it has (or waits while the POST may still land).
 *
 * Asserted from the receiver's own log (it does not dedupe: every POST is an effect): one effect per document
 * version and text, the receiver's current text is the file's current version, and every run's report matches the
 * receiver. The plans are drawn from a fixed seed, so a failure replays.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, it } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { FailureType } from '../src/contract';
import type { DeliveryLedger } from '../src/publisher/ledger';
import { resolveDelivery } from '../src/publisher/reconcile';
import type { Publication, Receipt } from '../src/publisher/types';
import { deliveryOf } from '../src/publisher/webhook-publisher';
import {
  answerLookup,
  closeServer,
  ledgerBackends,
  listenOnLoopback,
  lookupKeyOf,
  webhookPublisher,
} from './helpers';
import { mulberry32 } from './random';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();
const NO_ABORT = new AbortController().signal;
/** The POST's timeout: a claim may have its POST under way for it and a 5 s grace. */
const TIMEOUT_MS = 300;
const IN_FLIGHT_MS = deliveryOf(
  { documentId: 'x', title: '', textRef: 'x', summary: '', tags: [], model: { provider: 'x', model: 'x' } },
  'x',
  TIMEOUT_MS,
).inFlightMs;
const PLANS_PER_BACKEND = 3;
const STEPS_PER_PLAN = 5;

type PostFault = 'none' | 'lose-answer' | 'lose-request' | 'stall';
type LookupFault = 'answer' | 'timeout' | 'cut';

interface Effect {
  key: string;
  textRef: string;
  /** The publication's summary step field, as the body carried it. */
  summary: unknown;
}

/** The receiver: no dedupe, a lookup in the documented shape, and the faults the plan sets for the next request. */
async function receiver() {
  const effects: Effect[] = [];
  let postFault: PostFault = 'none';
  let lookupFault: LookupFault = 'answer';
  const server = http.createServer((req, res) => {
    if (req.method === 'GET') {
      req.resume();
      if (lookupFault === 'cut') return void req.socket.destroy();
      if (lookupFault === 'timeout') return; // never answered: the lookup times out
      const key = lookupKeyOf(req);
      const effect = effects.find((e) => e.key === key);
      return answerLookup(res, key, effect && { revision: 1, textRef: effect.textRef });
    }
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString('utf8')));
    req.on('end', () => {
      const fault = postFault;
      postFault = 'none';
      const publication = JSON.parse(body) as Publication;
      const effect = {
        key: String(req.headers['idempotency-key']),
        textRef: publication.textRef,
        summary: publication.summary,
      };
      if (fault === 'lose-request') return void req.socket.destroy();
      const apply = (): void => {
        effects.push(effect);
        if (fault === 'lose-answer') return void req.socket.destroy();
        if (!res.writableEnded && !req.socket.destroyed)
          res.writeHead(201).end(JSON.stringify({ revision: effects.length }));
      };
      // A stalled POST is processed after its sender gave up on it, and lands then.
      if (fault === 'stall') setTimeout(apply, TIMEOUT_MS + 200).unref();
      else apply();
    });
  });
  const origin = await listenOnLoopback(server);
  defer(() => closeServer(server));
  return {
    url: `${origin}/publications`,
    lookupUrl: `${origin}/publications/{key}`,
    effects,
    fault(post: PostFault, lookup: LookupFault) {
      postFault = post;
      lookupFault = lookup;
    },
    lookupAnswers() {
      lookupFault = 'answer';
    },
  };
}

const version = (n: number): string => `sha256:${n.toString(16).padStart(64, '0')}`;

interface Run {
  key: string;
  publication: Publication;
  receipt?: Receipt;
}

/**
 * Publishes `run` until it is settled: a retry after each failure, and, when the delivery is held, an operator
 * who checks the receiver and says what it has, or waits while the held POST may still land.
 */
async function settle(
  run: Run,
  publish: (run: Run) => Promise<Receipt>,
  ledger: DeliveryLedger,
  target: Awaited<ReturnType<typeof receiver>>,
): Promise<void> {
  const deadline = Date.now() + 120_000;
  for (let tries = 1; ; tries++) {
    assert.ok(Date.now() < deadline, `${run.key} did not settle within 2 minutes (${tries} tries)`);
    try {
      run.receipt = await publish(run);
      return;
    } catch (err) {
      assert.ok(err instanceof ApplicationFailure || err instanceof Error, String(err));
      const held = err instanceof ApplicationFailure && err.type === FailureType.DeliveryHeld;
      // The faults are for one try: the next one finds a working receiver and lookup.
      target.lookupAnswers();
      if (!held) continue;
      const heldKey = (err.details?.[0] as { heldKey?: string } | undefined)?.heldKey;
      assert.ok(heldKey !== undefined, err.message);
      // The operator waits out a POST that may still land, then says what the receiver has under the key.
      await sleep(IN_FLIGHT_MS + 100);
      const effect = target.effects.find((e) => e.key === heldKey);
      const verdict = await resolveDelivery(
        ledger,
        heldKey,
        effect === undefined ? { kind: 'unsent' } : { kind: 'delivered', revision: 1 },
        { requestTimeoutMs: TIMEOUT_MS },
      );
      // Refused only when the claim moved on meanwhile; the next try sees where it stands.
      if (!verdict.ok) assert.match(verdict.message, /moved on|No open delivery/, verdict.message);
    }
  }
}

for (const backend of ledgerBackends(defer)) {
  describe(`runs of one document through edits, reverts, reruns and faults (${backend.name})`, () => {
    for (let plan = 1; plan <= PLANS_PER_BACKEND; plan++) {
      it(
        `plan ${plan}: one effect per version and text, the receiver shows the file, every report matches`,
        { timeout: 300_000 },
        async () => {
          const next = mulberry32(plan * 7919 + backend.name.length);
          const pick = <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)]!;
          const ledger = await backend.ledger();
          const target = await receiver();
          const publisher = webhookPublisher(defer, target.url, {
            ledger,
            policy: 'hold',
            timeoutMs: TIMEOUT_MS,
            lookupUrl: target.lookupUrl,
          });
          const documentId = `doc-plan-${plan}`;
          const history: number[] = [1];
          let runs = 0;
          const all: Run[] = [];
          const newRun = (n: number, model: string): Run => {
            runs += 1;
            return {
              key: `run-${runs}:publish`,
              publication: {
                documentId,
                title: 'A title',
                textRef: version(n),
                summary: `Version ${n} by ${model}.`,
                tags: ['checkpoints'],
                model: { provider: 'offline', model },
              },
            };
          };
          const steps: string[] = [];
          for (let step = 1; step <= STEPS_PER_PLAN; step++) {
            const action = step === 1 ? 'submit' : pick(['edit', 'revert', 'rerun'] as const);
            if (action === 'edit') history.push(Math.max(...history) + 1);
            // A revert goes back to the text before the current one; with none yet, it is an edit.
            if (action === 'revert') {
              const before = history.at(-2);
              history.push(before ?? Math.max(...history) + 1);
            }
            const current = history.at(-1)!;
            const run = newRun(current, action === 'rerun' ? `model-${step}` : 'model-a');
            all.push(run);
            const post = pick(['none', 'lose-answer', 'lose-request', 'stall'] as const);
            const lookup = pick(['answer', 'answer', 'timeout', 'cut'] as const);
            // Some runs fail after one try (cancelled, or out of time) and the file is submitted again: a new run of
            // the same text, under its own key, finds what the failed run left in the ledger.
            const abandoned = next() < 0.3;
            steps.push(
              `${action} v${current} ${run.key} (POST ${post}, lookup ${lookup}${abandoned ? ', abandoned' : ''})`,
            );
            target.fault(post, lookup);
            if (abandoned) {
              await publisher.publish(run.publication, run.key, NO_ABORT).then(
                (receipt) => (run.receipt = receipt),
                () => undefined,
              );
              target.lookupAnswers();
              if (run.receipt !== undefined) continue;
              const again: Run = { key: `run-${++runs}:publish`, publication: run.publication };
              all.push(again);
              steps.push(`resubmit ${again.key}`);
              await settle(again, (r) => publisher.publish(r.publication, r.key, NO_ABORT), ledger, target);
            } else {
              await settle(run, (r) => publisher.publish(r.publication, r.key, NO_ABORT), ledger, target);
            }
          }
          // Let any stalled POST land before the receiver is read.
          await sleep(TIMEOUT_MS + 400);
          const said = `plan: ${steps.join('; ')}\nreceiver: ${JSON.stringify(target.effects)}`;

          // One effect per version and text: a key never lands twice, and no text lands twice in a row (a revert
          // publishes an earlier text again, after another one).
          assert.equal(
            new Set(target.effects.map((e) => e.key)).size,
            target.effects.length,
            `a key twice; ${said}`,
          );
          target.effects.forEach((effect, i) => {
            const before = target.effects[i - 1];
            assert.ok(
              before === undefined || before.textRef !== effect.textRef || before.summary !== effect.summary,
              `published twice (${before?.key}, ${effect.key}); ${said}`,
            );
          });
          // The receiver shows the file's current version.
          const last = all.at(-1)!;
          assert.equal(
            target.effects.at(-1)?.textRef,
            last.publication.textRef,
            `not the current version; ${said}`,
          );
          // Every run's report matches the receiver: what it reports published is there, with its version.
          for (const run of all) {
            // A run abandoned after a failed try reports nothing.
            if (run.receipt === undefined) continue;
            const mine = target.effects.find((e) => e.key === run.key);
            const same = target.effects.find(
              (e) => e.textRef === run.publication.textRef && e.summary === run.publication.summary,
            );
            assert.ok(
              mine !== undefined || same !== undefined,
              `${run.key} reported published, not there; ${said}`,
            );
            if (!run.receipt.duplicate)
              assert.ok(mine !== undefined, `${run.key}: a new delivery not under its key; ${said}`);
          }
        },
      );
    }
  });
}
