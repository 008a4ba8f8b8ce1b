/**
 * The stores' contract, written once and run against both backends: the SQLite files of one machine and the
 * fleet's PostgreSQL. Each test gets empty stores of its own (a scratch folder, or a fresh schema of the file's
 * database), so counts and sweeps see only what the test wrote. The schema's migrations have their own file
 * (migrations.test.ts).
 */
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ModelInfo } from '../src/contract';
import { blobRefOf, FileBlobStore } from '../src/documents/blobs';
import type { BlobStore } from '../src/documents/blobs';
import { TableBlobStore } from '../src/documents/blobs-table';
import { memoKeyFor, memoRequestHash } from '../src/model/memo';
import type { AnswerMemo, Claim, MemoRequest, RejectedAnswer, StoredAnswer } from '../src/model/memo';
import { SqlAnswerMemo, SqliteAnswerMemo } from '../src/model/memo-store';
import type { Delivery, DeliveryLedger, LedgerClaim, LedgerEntry } from '../src/publisher/ledger';
import { SqlDeliveryLedger, SqliteDeliveryLedger } from '../src/publisher/ledger-store';
import { SqlitePublicationStore, SqlPublicationStore } from '../src/publisher/publication-store';
import type { PublicationStore } from '../src/publisher/publication-store';
import type { Publication, Receipt } from '../src/publisher/types';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import { cleanupAfterAll, scratchDir } from './scratch';
import { freshSchema } from './postgres';
import { openClaimOf } from './helpers';

const defer = cleanupAfterAll();
/** A receiver's origin, as the webhook publisher records it. */
const RECEIVER = 'https://receiver.example';

/** The four stores on one empty location. */
interface OpenStores {
  blobs: BlobStore;
  memo: AnswerMemo;
  ledger: DeliveryLedger;
  publications: PublicationStore;
  /** Replaces a blob's stored bytes behind the store's back, as a damaged disk or a stray UPDATE would. */
  damageBlob(ref: string, bytes: Uint8Array): Promise<void>;
  close(): Promise<void>;
}

interface Backend {
  name: string;
  /** Opens the stores on a fresh, empty location, removed after the file's tests. */
  open(): Promise<OpenStores>;
}

const sqliteFiles: Backend = {
  name: 'SQLite files',
  open() {
    const dir = scratchDir(defer, 'stores-test-');
    const blobDir = path.join(dir, 'blobs');
    const memo = new SqliteAnswerMemo(path.join(dir, 'memo.sqlite'));
    const ledger = new SqliteDeliveryLedger(path.join(dir, 'ledger.sqlite'));
    const publications = new SqlitePublicationStore(path.join(dir, 'publications.sqlite'));
    return Promise.resolve({
      blobs: new FileBlobStore(blobDir),
      memo,
      ledger,
      publications,
      damageBlob(ref, bytes) {
        // Found by its name, so this test does not spell the store's folder layout a second time.
        const hex = ref.replace(/^sha256:/, '');
        const entries = fs.readdirSync(blobDir, { recursive: true, encoding: 'utf8' });
        const file = entries.find((entry) => path.basename(entry) === hex);
        assert.ok(file !== undefined, `no file for ${ref} under ${blobDir}`);
        fs.writeFileSync(path.join(blobDir, file), bytes);
        return Promise.resolve();
      },
      async close() {
        await memo.close();
        await ledger.close();
        await publications.close();
      },
    });
  },
};

const postgres: Backend = {
  name: 'PostgreSQL',
  async open() {
    const pool = await openPostgres(await freshSchema(defer));
    const db = postgresSql(pool);
    return {
      blobs: new TableBlobStore(db),
      memo: new SqlAnswerMemo(db),
      ledger: new SqlDeliveryLedger(db),
      publications: new SqlPublicationStore(db),
      async damageBlob(ref, bytes) {
        const result = await pool.query('UPDATE blobs SET bytes = $2 WHERE ref = $1', [
          ref,
          Buffer.from(bytes),
        ]);
        assert.equal(result.rowCount, 1, `no row for ${ref}`);
      },
      close: () => pool.end(),
    };
  },
};

// ---------------------------------------------------------------------------------------------------------------
// Values the tests store
// ---------------------------------------------------------------------------------------------------------------

const MODEL: ModelInfo = { provider: 'offline', model: 'offline-test' };
const LEASE_MS = 60_000;
/**
 * A lease short enough to wait out, and long enough that the statements a test makes inside it (a second claim, a
 * renewal halfway) still land inside it on a busy machine: at 200 ms, a stall of the event loop under Node 24's
 * parallel test files let one lapse between two claims made back to back.
 */
const SHORT_LEASE_MS = 1_500;
/** A sweep cutoff after everything the test stored: all of it counts as old. */
const everythingOld = (): Date => new Date(Date.now() + 1_000);
/** A sweep cutoff before anything the test stored: none of it counts as old. */
const nothingOld = (): Date => new Date(Date.now() - 60_000);

function storedAnswer(value: string): StoredAnswer {
  return { value, usage: { inputTokens: 120, outputTokens: 30 }, model: MODEL };
}

function rejectedAnswer(runId: string): RejectedAnswer {
  return {
    runId,
    usage: { inputTokens: 120, outputTokens: 500 },
    model: MODEL,
    error: 'cut off at max tokens',
  };
}

/** The summarize request of one input in a fresh workflow, keyed as the model steps key it. */
function memoRequest({
  workflowId = `wf-${randomUUID()}`,
  runId = 'run-1',
  input = 'chunk 1',
} = {}): MemoRequest {
  const step = 'summarize';
  const requestHash = memoRequestHash({ step, input, identity: 'v1' });
  return { memoKey: memoKeyFor(workflowId, step, requestHash), workflowId, runId, step, requestHash };
}

/** A claim without a held lease's deadline (a time no test can predict), to compare with deepEqual. */
function outcome(claim: Claim): unknown {
  return claim.kind === 'held' ? { kind: 'held', owner: claim.owner } : claim;
}

const OWNED_FRESH: Claim = { kind: 'owned', providerFailures: 0, rejected: [] };

/** The publish delivery of a fresh workflow. */
function delivery(): Delivery {
  const workflowId = `wf-${randomUUID()}`;
  return {
    idempotencyKey: `${workflowId}/run-1:publish`,
    workflowId,
    documentId: `doc-${randomUUID()}`,
    version: `sha256:${'1'.repeat(64)}`,
    inFlightMs: 0,
  };
}

/** The entry of an open ledger claim; fails the test for any other claim. */
function openEntry(claim: LedgerClaim): LedgerEntry {
  assert.ok(claim.kind === 'open', `expected an open claim, got ${JSON.stringify(claim)}`);
  return claim.entry;
}

function publication(documentId: string, fields: Partial<Publication> = {}): Publication {
  return {
    documentId,
    title: 'Checkpoints',
    textRef: blobRefOf(Buffer.from(documentId)),
    summary: 'Restarts skip finished steps.',
    tags: ['checkpoints'],
    model: MODEL,
    ...fields,
  };
}

const newDocumentId = (): string => `doc-${randomUUID()}`;

// ---------------------------------------------------------------------------------------------------------------
// The contract
// ---------------------------------------------------------------------------------------------------------------

/** What every backend's stores must do. */
function storeContract(backend: Backend): void {
  describe(backend.name, () => {
    let stores: OpenStores;
    beforeEach(async () => {
      stores = await backend.open();
    });
    afterEach(() => stores.close());

    describe('blobs', () => {
      it('gives back the bytes it stored, under their content hash', async () => {
        const bytes = Buffer.from('# Checkpoints\n\nRestarts skip finished steps.');
        const ref = await stores.blobs.put(bytes);
        assert.equal(ref, blobRefOf(bytes));
        assert.deepEqual(await stores.blobs.get(ref), bytes);
      });

      it('stores the same bytes once, under the same reference', async () => {
        const first = await stores.blobs.put(Buffer.from('same text'));
        assert.equal(await stores.blobs.put(Buffer.from('same text')), first);
        assert.notEqual(await stores.blobs.put(Buffer.from('other text')), first);
        assert.equal(
          await stores.blobs.sweep(everythingOld(), new Set()),
          2,
          'the same bytes were stored twice',
        );
      });

      it('answers undefined for a reference it does not have', async () => {
        assert.equal(await stores.blobs.get(blobRefOf(Buffer.from('never stored'))), undefined);
      });

      it('refuses damaged bytes, naming the reference', async () => {
        const ref = await stores.blobs.put(Buffer.from('the original text'));
        await stores.damageBlob(ref, Buffer.from('the damaged text'));
        await assert.rejects(stores.blobs.get(ref), { message: new RegExp(`blob ${ref} is corrupt`) });
      });

      it('sweeps old blobs nobody keeps, never kept or recent ones', async () => {
        const kept = await stores.blobs.put(Buffer.from('kept: a workflow still reads it'));
        const dropped = await stores.blobs.put(Buffer.from('dropped'));
        assert.equal(await stores.blobs.sweep(nothingOld(), new Set()), 0, 'a recent blob was swept');
        assert.equal(await stores.blobs.sweep(everythingOld(), new Set([kept])), 1);
        assert.equal(await stores.blobs.get(dropped), undefined);
        assert.deepEqual(await stores.blobs.get(kept), Buffer.from('kept: a workflow still reads it'));
      });
    });

    describe('model-answer memo', () => {
      it('gives a fresh entry to its first claimer', async () => {
        assert.deepEqual(await stores.memo.claim(memoRequest(), 'worker-a', LEASE_MS), OWNED_FRESH);
      });

      it('holds a live claim against other owners, naming the owner', async () => {
        const request = memoRequest();
        await stores.memo.claim(request, 'worker-a', LEASE_MS);
        const claim = await stores.memo.claim(request, 'worker-b', LEASE_MS);
        assert.deepEqual(outcome(claim), { kind: 'held', owner: 'worker-a' });
        assert.ok(claim.kind === 'held' && claim.leaseUntil > new Date(), 'the held lease is not live');
      });

      it('answers every later claim, of any owner or run, once completed', async () => {
        const request = memoRequest();
        await stores.memo.claim(request, 'worker-a', LEASE_MS);
        const answer = storedAnswer('Restarts skip finished steps.');
        assert.deepEqual(await stores.memo.complete(request.memoKey, answer), answer);
        for (const [owner, runId] of [
          ['worker-a', 'run-1'],
          ['worker-b', 'run-1'],
          ['worker-c', 'run-2'],
        ] as const) {
          assert.deepEqual(await stores.memo.claim({ ...request, runId }, owner, LEASE_MS), {
            kind: 'answered',
            answer,
            rejected: [],
          });
        }
      });

      it('keeps the first answer when completed twice, and returns it to the second', async () => {
        const request = memoRequest();
        await stores.memo.claim(request, 'worker-a', LEASE_MS);
        const first = storedAnswer('first');
        await stores.memo.complete(request.memoKey, first);
        assert.deepEqual(await stores.memo.complete(request.memoKey, storedAnswer('second')), first);
        assert.deepEqual(await stores.memo.claim(request, 'worker-b', LEASE_MS), {
          kind: 'answered',
          answer: first,
          rejected: [],
        });
      });

      it('lets another owner take over once the lease has run out', async () => {
        const request = memoRequest();
        await stores.memo.claim(request, 'worker-a', SHORT_LEASE_MS);
        assert.equal((await stores.memo.claim(request, 'worker-b', LEASE_MS)).kind, 'held');
        await sleep(SHORT_LEASE_MS + 100);
        assert.deepEqual(await stores.memo.claim(request, 'worker-b', LEASE_MS), OWNED_FRESH);
        assert.deepEqual(outcome(await stores.memo.claim(request, 'worker-a', LEASE_MS)), {
          kind: 'held',
          owner: 'worker-b',
        });
      });

      it("keeps a renewed claim past the lease's first deadline", async () => {
        const request = memoRequest();
        await stores.memo.claim(request, 'worker-a', SHORT_LEASE_MS);
        await sleep(SHORT_LEASE_MS / 2);
        assert.equal(await stores.memo.renew(request.memoKey, 'worker-a', LEASE_MS), true);
        await sleep(SHORT_LEASE_MS);
        assert.deepEqual(outcome(await stores.memo.claim(request, 'worker-b', LEASE_MS)), {
          kind: 'held',
          owner: 'worker-a',
        });
      });

      it('refuses to renew for an owner that does not hold the entry', async () => {
        const request = memoRequest();
        await stores.memo.claim(request, 'worker-a', LEASE_MS);
        assert.equal(await stores.memo.renew(request.memoKey, 'worker-b', LEASE_MS), false);
        await stores.memo.complete(request.memoKey, storedAnswer('done'));
        assert.equal(
          await stores.memo.renew(request.memoKey, 'worker-a', LEASE_MS),
          false,
          'renewed an answer',
        );
      });

      it("counts the run's provider failures on release, freeing the claim for the next attempt", async () => {
        const request = memoRequest();
        await stores.memo.claim(request, 'attempt-1', LEASE_MS);
        assert.equal(await stores.memo.release(request.memoKey, 'attempt-1', { providerFailure: true }), 1);
        assert.deepEqual(await stores.memo.claim(request, 'attempt-2', LEASE_MS), {
          kind: 'owned',
          providerFailures: 1,
          rejected: [],
        });
        assert.equal(await stores.memo.release(request.memoKey, 'attempt-2', { providerFailure: true }), 2);
      });

      it('keeps a rejected answer on release and hands it to the next claim of the run', async () => {
        const request = memoRequest();
        const rejected = rejectedAnswer(request.runId);
        await stores.memo.claim(request, 'attempt-1', LEASE_MS);
        assert.equal(await stores.memo.release(request.memoKey, 'attempt-1', { rejected }), 1);
        assert.deepEqual(await stores.memo.claim(request, 'attempt-2', LEASE_MS), {
          kind: 'owned',
          providerFailures: 1,
          rejected: [rejected],
        });
      });

      it("starts a new run's claim with no provider failures and no rejected answers", async () => {
        const request = memoRequest({ runId: 'run-1' });
        await stores.memo.claim(request, 'attempt-1', LEASE_MS);
        await stores.memo.release(request.memoKey, 'attempt-1', { rejected: rejectedAnswer('run-1') });
        await stores.memo.claim(request, 'attempt-2', LEASE_MS);
        await stores.memo.release(request.memoKey, 'attempt-2', { providerFailure: true });
        assert.deepEqual(
          await stores.memo.claim({ ...request, runId: 'run-2' }, 'attempt-3', LEASE_MS),
          OWNED_FRESH,
        );
        assert.equal(await stores.memo.release(request.memoKey, 'attempt-3', { providerFailure: true }), 1);
      });

      it('misses for another request of the same workflow and step', async () => {
        const answered = memoRequest({ input: 'chunk 1' });
        await stores.memo.claim(answered, 'worker-a', LEASE_MS);
        await stores.memo.complete(answered.memoKey, storedAnswer('chunk 1, summarized'));
        const other = memoRequest({ workflowId: answered.workflowId, input: 'chunk 2' });
        assert.notEqual(other.memoKey, answered.memoKey);
        assert.deepEqual(await stores.memo.claim(other, 'worker-a', LEASE_MS), OWNED_FRESH);
      });

      it('counts answered entries only', async () => {
        const requests = [memoRequest(), memoRequest(), memoRequest()];
        for (const request of requests) await stores.memo.claim(request, 'worker-a', LEASE_MS);
        for (const request of requests.slice(1)) {
          await stores.memo.complete(request.memoKey, storedAnswer('answered'));
        }
        assert.equal(await stores.memo.count(), 2);
      });

      it("sweeps old entries of closed workflows, answered or not, keeping open workflows' entries", async () => {
        const ofOpenWorkflow = memoRequest();
        const answered = memoRequest();
        const unanswered = memoRequest();
        const answer = storedAnswer('answered');
        for (const request of [ofOpenWorkflow, answered, unanswered]) {
          await stores.memo.claim(request, 'worker-a', LEASE_MS);
        }
        await stores.memo.complete(ofOpenWorkflow.memoKey, answer);
        await stores.memo.complete(answered.memoKey, answer);
        const open = new Set([ofOpenWorkflow.workflowId]);
        assert.equal(await stores.memo.sweep(nothingOld(), open), 0, 'a recent entry was swept');
        assert.equal(await stores.memo.sweep(everythingOld(), open), 2);
        assert.deepEqual(await stores.memo.claim(ofOpenWorkflow, 'worker-b', LEASE_MS), {
          kind: 'answered',
          answer,
          rejected: [],
        });
        assert.deepEqual(await stores.memo.claim(answered, 'worker-b', LEASE_MS), OWNED_FRESH);
      });

      /** Ten owners claim `request` at once: exactly one owns it, the others see it held by that one. */
      async function claimedByOneOfTen(request: MemoRequest): Promise<string> {
        const owners = Array.from({ length: 10 }, (_, i) => `worker-${i}`);
        const claims = await Promise.all(owners.map((owner) => stores.memo.claim(request, owner, LEASE_MS)));
        const winners = owners.filter((_, i) => claims[i]?.kind === 'owned');
        assert.equal(winners.length, 1, `owned by ${winners.join(', ')}`);
        assert.deepEqual(
          claims.filter((claim) => claim.kind !== 'owned').map(outcome),
          Array.from({ length: 9 }, () => ({ kind: 'held', owner: winners[0] })),
        );
        return winners[0] ?? '';
      }

      it('gives an entry to exactly one of many concurrent claimers, fresh or freed', async () => {
        const request = memoRequest();
        const first = await claimedByOneOfTen(request);
        await stores.memo.release(request.memoKey, first, { providerFailure: true });
        await claimedByOneOfTen(request);
      });
    });

    describe('delivery ledger', () => {
      const receipt: Receipt = { documentId: 'doc-1', revision: 1, duplicate: false };

      it('lets the first claimer POST and shows later ones its open claim', async () => {
        const d = delivery();
        assert.deepEqual(await stores.ledger.claim(d, 'attempt-1'), { kind: 'fresh' });
        const { updatedAt, ageMs, ...entry } = openEntry(await stores.ledger.claim(d, 'attempt-2'));
        const { idempotencyKey, workflowId, documentId, version } = d;
        assert.deepEqual(entry, {
          idempotencyKey,
          workflowId,
          documentId,
          state: 'claimed',
          owner: 'attempt-1',
          attempts: 1,
          lastError: null,
          version,
        });
        assert.ok(ageMs >= 0 && ageMs < 60_000, `ageMs is ${ageMs}`);
        assert.ok(
          Math.abs(updatedAt.getTime() - Date.now()) < 60_000,
          `updatedAt is ${updatedAt.toISOString()}`,
        );
      });

      it('answers from the receipt once delivered', async () => {
        const d = delivery();
        await stores.ledger.claim(d, 'attempt-1');
        await stores.ledger.delivered(d.idempotencyKey, 'attempt-1', receipt, undefined);
        assert.deepEqual(await stores.ledger.claim(d, 'attempt-2'), { kind: 'delivered', receipt });
      });

      it('lets the next claim POST again after an attempt provably did not land, counting attempts', async () => {
        const d = delivery();
        await stores.ledger.claim(d, 'attempt-1');
        await stores.ledger.unsent(d.idempotencyKey, 'attempt-1', 'connection refused');
        assert.deepEqual(await stores.ledger.claim(d, 'attempt-2'), { kind: 'fresh' });
        const entry = openEntry(await stores.ledger.claim(d, 'attempt-3'));
        assert.deepEqual([entry.owner, entry.attempts], ['attempt-2', 2]);
      });

      it('lets an open claim be taken over, counting the attempt', async () => {
        const d = delivery();
        await stores.ledger.claim(d, 'attempt-1');
        const seen = openEntry(await stores.ledger.claim(d, 'attempt-2'));
        assert.equal(await stores.ledger.retake(seen, 'attempt-2'), true);
        assert.equal(await stores.ledger.retake(seen, 'attempt-stale'), false, 'a stale view took it over');
        const entry = openEntry(await stores.ledger.claim(d, 'attempt-3'));
        assert.deepEqual([entry.owner, entry.attempts], ['attempt-2', 2]);
      });

      it('lists the claims nobody recorded an answer for, and only those', async () => {
        const [open, delivered, unsent] = [delivery(), delivery(), delivery()];
        for (const d of [open, delivered, unsent]) await stores.ledger.claim(d, 'attempt-1');
        await stores.ledger.delivered(delivered.idempotencyKey, 'attempt-1', receipt, RECEIVER);
        await stores.ledger.unsent(unsent.idempotencyKey, 'attempt-1', 'HTTP 503');
        const claims = await stores.ledger.openClaims();
        assert.deepEqual(
          claims.map((entry) => entry.idempotencyKey),
          [open.idempotencyKey],
        );
      });

      it("settles an open claim by an operator's verdict", async () => {
        const [lost, landed] = [delivery(), delivery()];
        for (const d of [lost, landed]) await stores.ledger.claim(d, 'attempt-1');
        assert.equal(
          await stores.ledger.resolve(await openClaimOf(stores.ledger, lost.idempotencyKey), 'unsent'),
          true,
        );
        assert.equal(
          await stores.ledger.resolve(await openClaimOf(stores.ledger, landed.idempotencyKey), {
            delivered: receipt,
          }),
          true,
        );
        assert.deepEqual(await stores.ledger.openClaims(), []);
        assert.deepEqual(await stores.ledger.claim(lost, 'attempt-2'), { kind: 'fresh' });
        assert.deepEqual(await stores.ledger.claim(landed, 'attempt-2'), { kind: 'delivered', receipt });
      });

      it('refuses a verdict for a key without an open claim', async () => {
        const [delivered, unsent] = [delivery(), delivery()];
        for (const d of [delivered, unsent]) await stores.ledger.claim(d, 'attempt-1');
        const seen = await Promise.all(
          [delivered, unsent].map((d) => openClaimOf(stores.ledger, d.idempotencyKey)),
        );
        await stores.ledger.delivered(delivered.idempotencyKey, 'attempt-1', receipt, undefined);
        await stores.ledger.unsent(unsent.idempotencyKey, 'attempt-1', 'HTTP 503');
        const never = { idempotencyKey: 'never-claimed', owner: 'attempt-1', attempts: 1 };
        for (const claim of [...seen, never]) {
          const key = claim.idempotencyKey;
          assert.equal(await stores.ledger.resolve(claim, 'unsent'), false, `resolved ${key}`);
          assert.equal(await stores.ledger.resolve(claim, { delivered: receipt }), false, `resolved ${key}`);
        }
        assert.deepEqual(await stores.ledger.claim(delivered, 'attempt-2'), { kind: 'delivered', receipt });
      });

      it('trusts a receiver to honour keys only once it echoed one, and only that receiver', async () => {
        const [unechoed, echoed] = [delivery(), delivery()];
        assert.equal(await stores.ledger.receiverHonoursKeys(RECEIVER), false);
        await stores.ledger.claim(unechoed, 'attempt-1');
        await stores.ledger.delivered(unechoed.idempotencyKey, 'attempt-1', receipt, undefined);
        assert.equal(await stores.ledger.receiverHonoursKeys(RECEIVER), false);
        await stores.ledger.claim(echoed, 'attempt-1');
        await stores.ledger.delivered(echoed.idempotencyKey, 'attempt-1', receipt, RECEIVER);
        assert.equal(await stores.ledger.receiverHonoursKeys(RECEIVER), true);
        assert.equal(await stores.ledger.receiverHonoursKeys('https://another-receiver.example'), false);
      });

      it('keeps a claim open through an answer that proves nothing, with that answer noted', async () => {
        const d = delivery();
        await stores.ledger.claim(d, 'attempt-1');
        await stores.ledger.note(d.idempotencyKey, 'attempt-1', 'HTTP 504');
        const entry = openEntry(await stores.ledger.claim(d, 'attempt-2'));
        assert.deepEqual([entry.state, entry.lastError], ['claimed', 'HTTP 504']);
      });

      it('takes its own claim again when the COMMIT of it went unanswered and the claim was repeated', async () => {
        const d = delivery();
        assert.deepEqual(await stores.ledger.claim(d, 'attempt-1'), { kind: 'fresh' });
        assert.deepEqual(await stores.ledger.claim(d, 'attempt-1'), { kind: 'fresh' });
      });

      it("shows a later run of the same version the earlier run's open claim, and only while it is open", async () => {
        const first = delivery();
        await stores.ledger.claim(first, 'run-1-attempt');
        const again = { ...first, idempotencyKey: `${first.workflowId}/run-2:publish` };
        assert.equal(
          openEntry(await stores.ledger.claim(again, 'run-2-attempt')).idempotencyKey,
          first.idempotencyKey,
        );
        const otherVersion = {
          ...again,
          idempotencyKey: `${first.workflowId}/run-3:publish`,
          version: 'sha256:other',
        };
        assert.deepEqual(await stores.ledger.claim(otherVersion, 'run-3-attempt'), { kind: 'fresh' });
        await stores.ledger.resolve(await openClaimOf(stores.ledger, first.idempotencyKey), 'unsent');
        assert.deepEqual(await stores.ledger.claim(again, 'run-2-attempt'), { kind: 'fresh' });
      });

      it("leaves another run's claim whose POST may still be under way to its own attempt, until it is noted as ended", async () => {
        const first = delivery();
        await stores.ledger.claim(first, 'run-1-attempt');
        const again = { ...first, idempotencyKey: `${first.workflowId}/run-2:publish`, inFlightMs: 60_000 };
        assert.deepEqual(await stores.ledger.claim(again, 'run-2-attempt'), { kind: 'fresh' });
        const third = { ...first, idempotencyKey: `${first.workflowId}/run-3:publish`, inFlightMs: 60_000 };
        await stores.ledger.note(first.idempotencyKey, 'run-1-attempt', 'no answer within 15000 ms');
        assert.equal(
          openEntry(await stores.ledger.claim(third, 'run-3-attempt')).idempotencyKey,
          first.idempotencyKey,
        );
      });

      it("records a receipt for a run that settled through an earlier run's delivery", async () => {
        const d = delivery();
        const later = { ...d, idempotencyKey: `${d.workflowId}/run-2:publish` };
        await stores.ledger.claim(d, 'run-1-attempt');
        openEntry(await stores.ledger.claim(later, 'run-2-attempt'));
        await stores.ledger.deliveredAs(later.idempotencyKey, receipt);
        assert.deepEqual(await stores.ledger.claim(later, 'run-2-retry'), { kind: 'delivered', receipt });
      });

      it("sweeps old settled deliveries of closed workflows, never open claims or open workflows' rows", async () => {
        const [stillOpen, delivered, unsent, ofOpenWorkflow] = [
          delivery(),
          delivery(),
          delivery(),
          delivery(),
        ];
        for (const d of [stillOpen, delivered, unsent, ofOpenWorkflow])
          await stores.ledger.claim(d, 'attempt-1');
        await stores.ledger.delivered(delivered.idempotencyKey, 'attempt-1', receipt, undefined);
        await stores.ledger.unsent(unsent.idempotencyKey, 'attempt-1', 'HTTP 503');
        await stores.ledger.delivered(ofOpenWorkflow.idempotencyKey, 'attempt-1', receipt, undefined);
        const open = new Set([ofOpenWorkflow.workflowId]);
        assert.equal(await stores.ledger.sweep(nothingOld(), open), 0, 'a recent delivery was swept');
        assert.equal(await stores.ledger.sweep(everythingOld(), open), 2);
        assert.deepEqual(
          (await stores.ledger.openClaims()).map((entry) => entry.idempotencyKey),
          [stillOpen.idempotencyKey],
        );
        assert.deepEqual(await stores.ledger.claim(ofOpenWorkflow, 'attempt-2'), {
          kind: 'delivered',
          receipt,
        });
        assert.deepEqual(await stores.ledger.claim(delivered, 'attempt-2'), { kind: 'fresh' });
      });
    });

    describe('publications', () => {
      it('writes a key once, answering its repeats as duplicates with the first receipt', async () => {
        const id = newDocumentId();
        const first = { documentId: id, revision: 1, duplicate: false };
        assert.deepEqual(await stores.publications.publish(publication(id), 'key-1'), first);
        const repeat = await stores.publications.publish(publication(id, { summary: 'changed' }), 'key-1');
        assert.deepEqual(repeat, { ...first, duplicate: true });
        assert.equal(
          (await stores.publications.currentPublication(id))?.fields.summary,
          publication(id).summary,
        );
        assert.deepEqual(await stores.publications.revisionsOf(id), [
          { revision: 1, idempotencyKey: 'key-1' },
        ]);
      });

      it("writes a new key for a known document as the document's next revision", async () => {
        const id = newDocumentId();
        await stores.publications.publish(publication(id), 'key-1');
        const second = publication(id, { title: 'Checkpoints, again', tags: ['a', 'b'] });
        assert.deepEqual(await stores.publications.publish(second, 'key-2'), {
          documentId: id,
          revision: 2,
          duplicate: false,
          changed: true,
        });
        assert.deepEqual(await stores.publications.currentPublication(id), {
          documentId: id,
          revision: 2,
          title: second.title,
          scheduledAt: null,
          fields: { summary: second.summary, tags: second.tags },
        });
        assert.deepEqual(await stores.publications.revisionsOf(id), [
          { revision: 1, idempotencyKey: 'key-1' },
          { revision: 2, idempotencyKey: 'key-2' },
        ]);
      });

      it('keeps the step fields it has never heard of as they came, and no base field among them', async () => {
        const id = newDocumentId();
        const tags = [
          { label: 'a', score: 0.5 },
          { label: 'b', score: 0.25 },
        ];
        const stored = publication(id, { headline: 'x', tags, scheduledAt: 1_000 });
        await stores.publications.publish(stored, 'key-1');
        assert.deepEqual(await stores.publications.currentPublication(id), {
          documentId: id,
          revision: 1,
          title: stored.title,
          scheduledAt: 1_000,
          fields: { summary: stored.summary, tags, headline: 'x' },
        });
      });

      it('answers a new key from an older run as superseded, writing nothing', async () => {
        const id = newDocumentId();
        await stores.publications.publish(publication(id, { scheduledAt: 2_000 }), 'newer-run');
        const late = publication(id, { title: 'From the replaced run', scheduledAt: 1_000 });
        assert.deepEqual(await stores.publications.publish(late, 'older-run'), {
          documentId: id,
          revision: 1,
          duplicate: false,
          superseded: true,
        });
        const current = await stores.publications.currentPublication(id);
        assert.deepEqual([current?.title, current?.scheduledAt], [publication(id).title, 2_000]);
        assert.deepEqual(await stores.publications.revisionsOf(id), [
          { revision: 1, idempotencyKey: 'newer-run' },
        ]);
        const later = await stores.publications.publish(publication(id, { scheduledAt: 3_000 }), 'later-run');
        assert.equal(later.revision, 2);
      });

      it('records every delivery in order, with what it did', async () => {
        const id = newDocumentId();
        await stores.publications.publish(publication(id, { scheduledAt: 2_000 }), 'key-1');
        await stores.publications.publish(publication(id, { scheduledAt: 2_000 }), 'key-1');
        await stores.publications.publish(publication(id, { scheduledAt: 1_000 }), 'key-old');
        await stores.publications.publish(publication(id, { scheduledAt: 3_000 }), 'key-2');
        const deliveries = await stores.publications.deliveries();
        assert.deepEqual(
          deliveries.map((d) => [d.idempotencyKey, d.documentId, d.outcome]),
          [
            ['key-1', id, 'created'],
            ['key-1', id, 'duplicate'],
            ['key-old', id, 'stale'],
            ['key-2', id, 'created'],
          ],
        );
        for (const d of deliveries) assert.ok(!Number.isNaN(Date.parse(d.receivedAt)), d.receivedAt);
      });

      it('counts documents, not revisions, and knows no publication of an unknown one', async () => {
        const [twice, once] = [newDocumentId(), newDocumentId()];
        await stores.publications.publish(publication(twice), 'key-1');
        await stores.publications.publish(publication(twice), 'key-2');
        await stores.publications.publish(publication(once), 'key-3');
        assert.equal(await stores.publications.countPublications(), 2);
        assert.equal(await stores.publications.currentPublication(newDocumentId()), undefined);
      });

      it('lets exactly one of many concurrent deliveries of one key write', async () => {
        const id = newDocumentId();
        const receipts = await Promise.all(
          Array.from({ length: 10 }, () => stores.publications.publish(publication(id), 'key-1')),
        );
        assert.deepEqual(receipts.map((r) => [r.revision, r.duplicate]).sort(), [
          [1, false],
          ...Array.from({ length: 9 }, () => [1, true]),
        ]);
        const outcomes = (await stores.publications.deliveries()).map((d) => d.outcome);
        assert.deepEqual(outcomes.sort(), ['created', ...Array.from({ length: 9 }, () => 'duplicate')]);
      });

      it('gives concurrent new keys of one document distinct revisions', async () => {
        const id = newDocumentId();
        const receipts = await Promise.all(
          Array.from({ length: 5 }, (_, i) => stores.publications.publish(publication(id), `key-${i}`)),
        );
        assert.deepEqual(receipts.map((r) => r.revision).sort(), [1, 2, 3, 4, 5]);
        assert.equal((await stores.publications.currentPublication(id))?.revision, 5);
      });
    });
  });
}

storeContract(sqliteFiles);
storeContract(postgres);
