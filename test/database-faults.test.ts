/**
 * The stores against a PostgreSQL that fails: every backend terminated under load (a failover), and connections
 * refused for a moment (a blip), through a TCP link of the test's own in front of the real server. The process
 * stays up, every call completes once the database is back, and a paid model answer is stored, never paid twice.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describe, it } from 'node:test';
import { MockActivityEnvironment } from '@temporalio/testing';
import { DefaultLogger } from '@temporalio/worker';
import { pipelineActivities } from '../src/cli/compose';
import type { SummarizeResult } from './requests';
import { Database, isOutage } from '../src/lib/postgres';
import { SqlAnswerMemo } from '../src/model/memo-store';
import { migrate } from '../src/store/migrate';
import { MIGRATIONS } from '../src/store/migrations';
import { postgresSql } from '../src/store/sql-postgres';
import { completion, modelServerFor, openAIModel, SAMPLE_TEXT, SUMMARY, tempParts } from './helpers';
import { cleanupAfterAll } from './scratch';
import { tcpLink } from './tcp-link';
import { freshDatabase, onDatabase, TEST_DATABASE_URL } from './postgres';

const defer = cleanupAfterAll();

/** The test PostgreSQL's database `url`, reached through a TCP link that can refuse connections for a while. */
async function databaseLink(url: string): Promise<{ url: string; blip: (ms: number) => Promise<void> }> {
  const target = new URL(url);
  const link = await tcpLink(defer, `${target.hostname}:${target.port || '5432'}`);
  const linked = new URL(url);
  linked.hostname = link.host;
  linked.port = String(link.port);
  return { url: linked.toString(), blip: (ms) => link.refuseFor(ms) };
}

/** Terminates every connection to the database of `url` but the caller's: what a failover does to a pool. */
async function terminateBackends(url: string): Promise<void> {
  const name = new URL(url).pathname.slice(1);
  await onDatabase(TEST_DATABASE_URL, (client) =>
    client.query(
      'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
      [name],
    ),
  );
}

describe('stores on a PostgreSQL that fails', () => {
  it('memo claims survive every backend being terminated, three times, mid-transaction: the process stays up and every call completes', async () => {
    const url = await freshDatabase(defer);
    const db = new Database(url);
    defer(() => db.end());
    await migrate(postgresSql(db), MIGRATIONS);
    const memo = new SqlAnswerMemo(postgresSql(db));
    const KEYS_PER_LOOP = 30;
    let done = 0;
    const loops = Array.from({ length: 8 }, async (_, loop) => {
      for (let i = 0; i < KEYS_PER_LOOP; i++) {
        const memoKey = `doc-${loop}:summarize:${i}`;
        const request = {
          memoKey,
          workflowId: `doc-${loop}`,
          step: 'summarize',
          requestHash: 'h',
          runId: 'r',
        };
        const claim = await memo.claim(request, `owner-${loop}`, 30_000);
        assert.equal(claim.kind, 'owned');
        await memo.complete(memoKey, {
          value: 'an answer',
          usage: { inputTokens: 1, outputTokens: 1 },
          model: { provider: 'offline', model: 'm' },
        });
        done++;
      }
    });
    for (let n = 0; n < 3; n++) {
      await new Promise((resolve) => setTimeout(resolve, 150));
      await terminateBackends(url);
    }
    await Promise.all(loops);
    assert.equal(done, 8 * KEYS_PER_LOOP);
    assert.equal(await memo.count(), 8 * KEYS_PER_LOOP);
  });

  it('connections refused for 1.5 s while the model answers: the paid answer is stored once the database is back, and the next attempt pays nothing', async () => {
    const link = await databaseLink(await freshDatabase(defer));
    let blip: Promise<void> | undefined;
    // The database goes away as the call is made and comes back 1.5 s later; the answer arrives in between.
    const server = await modelServerFor(defer, () => {
      blip ??= link.blip(1_500);
      return { body: completion(SUMMARY), delayMs: 300 };
    });
    const local = await tempParts(defer, { model: openAIModel(server), env: { DATABASE_URL: link.url } });
    Object.assign(local.deps, { memoLeaseMs: 1_000 });
    const textRef = await local.blobs.put(Buffer.from(SAMPLE_TEXT));
    const workflowId = `document-${randomUUID()}`;
    const runId = randomUUID();
    const attempt = (n: number): Promise<SummarizeResult> => {
      const env = new MockActivityEnvironment(
        {
          activityId: 'summarize',
          workflowExecution: { workflowId, runId },
          attempt: n,
          startToCloseTimeoutMs: 60_000,
        },
        { logger: new DefaultLogger('ERROR') },
      );
      return env.run(pipelineActivities(local.deps).summarize, {
        documentId: 'doc-1',
        textRef,
        maxSentences: 2,
      });
    };

    const first = await attempt(1);
    await blip;
    const second = await attempt(2);
    assert.equal(server.requests.length, 1, 'the model was paid twice for one request');
    assert.equal(first.summary, SUMMARY);
    assert.deepEqual([first.memoised, second.memoised], [false, true]);
  });

  it('tells an outage (retried on a fresh connection) from a statement that is wrong (not retried)', () => {
    const coded = (code: string, message = 'x') => Object.assign(new Error(message), { code });
    for (const outage of [
      coded('ECONNREFUSED'),
      coded('ECONNRESET'),
      coded('57P01', 'terminating connection due to administrator command'),
      coded('57P03', 'the database system is starting up'),
      coded('08006'),
      coded('40001'),
      new Error('Connection terminated unexpectedly'),
      new Error('timeout exceeded when trying to connect'),
    ])
      assert.equal(isOutage(outage), true, outage.message);
    for (const wrong of [
      coded('42P01', 'relation does not exist'),
      coded('23505'),
      coded('22012'),
      new Error('bad'),
    ])
      assert.equal(isOutage(wrong), false, wrong.message);
  });
});
