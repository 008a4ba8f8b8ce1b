/**
 * A PostgreSQL write whose commit happened and whose answer was lost: a TCP link of the test's own in front of the
 * real server cuts the connection as the server answers a commit (a COMMIT, or a write outside a transaction), so
 * the store's call meets an outage and retries. What committed must count once and be reported as done: a provider
 * error, a refused paid answer, a publication's first delivery, an operator's resolve, a reserved turn.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describe, it } from 'node:test';
import { sql } from 'kysely';
import { Database } from '../src/lib/postgres';
import { memoKeyFor, memoRequestHash } from '../src/model/memo';
import type { MemoRequest, RejectedAnswer } from '../src/model/memo';
import { SqlAnswerMemo } from '../src/model/memo-store';
import { SqlRateLimits } from '../src/model/rate-limit-store';
import { SqlDeliveryLedger } from '../src/publisher/ledger-store';
import { SqlPublicationStore } from '../src/publisher/publication-store';
import type { Sql } from '../src/store/sql';
import { openPostgres, postgresSql } from '../src/store/sql-postgres';
import { freshDatabase } from './postgres';
import { cleanupAfterAll } from './scratch';
import { tcpLink } from './tcp-link';
import type { TcpLink } from './tcp-link';

const defer = cleanupAfterAll();
const MODEL = { provider: 'offline', model: 'offline-test' };

/**
 * The server's answer to a commit, as it crosses the wire: a CommandComplete whose tag is COMMIT or a write's
 * (INSERT, UPDATE, DELETE), then ReadyForQuery saying the session is idle, out of any transaction, so it committed.
 */
const COMMITTED = /C[\s\S]{4}(?:COMMIT|INSERT \d+ \d+|UPDATE \d+|DELETE \d+)\0Z\0\0\0\x05I/;

/**
 * A migrated database, and two handles on it: `direct` to set up and to look, `linked` through a TCP link that the
 * test cuts. The linked pool's retries give up after 20 s, so a call that never recovers fails the test.
 */
async function database(): Promise<{ direct: Sql; linked: Sql; link: TcpLink }> {
  const url = await freshDatabase(defer);
  const pool = await openPostgres(url);
  defer(() => pool.end());
  const target = new URL(url);
  const link = await tcpLink(defer, `${target.hostname}:${target.port || '5432'}`);
  const linkedUrl = new URL(url);
  linkedUrl.hostname = link.host;
  linkedUrl.port = String(link.port);
  const linkedPool = new Database(linkedUrl.toString(), 20_000);
  defer(() => linkedPool.end());
  return { direct: postgresSql(pool), linked: postgresSql(linkedPool), link };
}

/** Runs `call` with the link set to cut the connection that next answers a commit, and checks that it did. */
async function withLostCommit<T>(link: TcpLink, call: () => Promise<T>): Promise<T> {
  const cut = link.cutBeforeAnswer((chunk) => COMMITTED.test(chunk.toString('latin1')));
  const result = await call();
  await Promise.race([
    cut,
    new Promise((_, reject) => setTimeout(() => reject(new Error('no commit was cut')), 5_000).unref()),
  ]);
  return result;
}

function memoRequest(): MemoRequest {
  const workflowId = `wf-${randomUUID()}`;
  const step = 'summarize';
  const requestHash = memoRequestHash({ step, input: 'chunk 1', identity: 'v1' });
  return {
    memoKey: memoKeyFor(workflowId, step, requestHash),
    workflowId,
    runId: 'run-1',
    step,
    requestHash,
  };
}

function rejectedAnswer(): RejectedAnswer {
  return {
    runId: 'run-1',
    usage: { inputTokens: 120, outputTokens: 500 },
    model: MODEL,
    error: 'cut off at max tokens',
  };
}

async function memoRow(db: Sql, memoKey: string): Promise<{ failures: number; rejected: unknown[] }> {
  const row = await db.first(
    sql<{ provider_failures: number; rejected: unknown[] }>`SELECT provider_failures, rejected
      FROM model_memo WHERE memo_key = ${memoKey}`,
  );
  assert.ok(row !== undefined, `no memo row ${memoKey}`);
  return { failures: row.provider_failures, rejected: row.rejected };
}

describe('a PostgreSQL commit whose answer is lost', () => {
  it('counts a provider error once', async () => {
    const { direct, linked, link } = await database();
    const memo = new SqlAnswerMemo(linked);
    const request = memoRequest();
    assert.equal((await memo.claim(request, 'owner-1', 60_000)).kind, 'owned');

    const failures = await withLostCommit(link, () =>
      memo.release(request.memoKey, 'owner-1', { providerFailure: true }),
    );

    assert.equal(failures, 1, 'the release reported another count than it committed');
    assert.deepEqual(await memoRow(direct, request.memoKey), { failures: 1, rejected: [] });
  });

  it('stores a refused paid answer once', async () => {
    const { direct, linked, link } = await database();
    const memo = new SqlAnswerMemo(linked);
    const request = memoRequest();
    assert.equal((await memo.claim(request, 'owner-1', 60_000)).kind, 'owned');

    await withLostCommit(link, () =>
      memo.release(request.memoKey, 'owner-1', { rejected: rejectedAnswer() }),
    );

    assert.deepEqual(await memoRow(direct, request.memoKey), { failures: 1, rejected: [rejectedAnswer()] });
  });

  it('claims, renews and completes a memo entry (writes safe to repeat, sent again as they are)', async () => {
    const { direct, linked, link } = await database();
    const memo = new SqlAnswerMemo(linked);
    const request = memoRequest();
    const claim = await withLostCommit(link, () => memo.claim(request, 'owner-1', 60_000));
    assert.deepEqual(claim, { kind: 'owned', providerFailures: 0, rejected: [] });
    assert.equal(await withLostCommit(link, () => memo.renew(request.memoKey, 'owner-1', 60_000)), true);
    const answer = { value: 'an answer', usage: { inputTokens: 1, outputTokens: 1 }, model: MODEL };
    assert.deepEqual(await withLostCommit(link, () => memo.complete(request.memoKey, answer)), answer);
    assert.equal(await new SqlAnswerMemo(direct).count(), 1);
  });

  it("answers a receiver's first delivery as created, not as a duplicate of itself", async () => {
    const { direct, linked, link } = await database();
    const documentId = `doc-${randomUUID()}`;
    const receipt = await withLostCommit(link, () =>
      new SqlPublicationStore(linked).publish(
        {
          documentId,
          title: 'Checkpoints',
          textRef: `sha256:${'1'.repeat(64)}`,
          summary: 'Restarts skip finished steps.',
          tags: ['checkpoints'],
          model: MODEL,
        },
        'run-1:publish',
      ),
    );

    assert.deepEqual(receipt, { documentId, revision: 1, duplicate: false });
    const deliveries = await new SqlPublicationStore(direct).deliveries();
    assert.deepEqual(
      deliveries.map((d) => d.outcome),
      ['created'],
    );
  });

  it("reports an operator's resolve as done when its update committed", async () => {
    const { direct, linked, link } = await database();
    const ledger = new SqlDeliveryLedger(linked);
    const workflowId = `wf-${randomUUID()}`;
    const key = `${workflowId}/run-1:publish`;
    const claim = await ledger.claim(
      { idempotencyKey: key, workflowId, documentId: 'doc-1', version: 'v1', inFlightMs: 0 },
      'owner-1',
    );
    assert.equal(claim.kind, 'fresh');

    const seen = { idempotencyKey: key, owner: 'owner-1', attempts: 1 };
    const resolved = await withLostCommit(link, () => ledger.resolve(seen, 'unsent'));

    assert.equal(resolved, true, 'the resolve committed and said it resolved nothing');
    assert.deepEqual(await new SqlDeliveryLedger(direct).openClaims(), []);
  });

  it('reserves one turn for a call, and gives the nonce that committed', async () => {
    const { direct, linked, link } = await database();
    const limits = new SqlRateLimits(linked);
    const answer = await withLostCommit(link, () =>
      limits.reserve(
        { scope: 's', holdKey: 'run-1:summarize', tokens: 10, usd: 0, workflowId: 'wf', leaseMs: 60_000 },
        {},
      ),
    );

    assert.equal(answer.kind, 'granted');
    const holds = await direct.rows(sql<{ nonce: string }>`SELECT nonce FROM model_call_holds`);
    assert.deepEqual(
      holds.map((h) => h.nonce),
      [answer.kind === 'granted' ? answer.nonce : undefined],
    );
  });
});
