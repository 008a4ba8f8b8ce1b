/**
 * The reviewer's tools answer, whatever the runs and the server do: a run whose draft cannot be read is shown with
 * its error (never taken for "no draft") by `npm run review` and the page; with no worker up, `npm run review`
 * says so and exits at its deadline, and a decision is answered within one, saying it was not taken, and is not
 * applied when a worker starts later; the time a decision records is the reviewer's; a name that is no document's
 * run, and a server that is down, get a clear refusal, not a stack trace or a 500.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { DECISION_WAIT_MS, REVIEW_STATUS } from '../src/contract/review';
import { awaitingReview, decide } from '../src/runs/review-queue';
import { startReviewPage } from '../src/runs/review-page';
import { reviewQuery } from '../src/workflow';
import {
  devServerEnv,
  installQuietRuntime,
  pipelineInput,
  pipelineWorker,
  SAMPLE_TEXT,
  startPipeline,
  tempParts,
} from './helpers';
import { cleanupAfterAll } from './scratch';

const ROOT = path.join(__dirname, '..');
const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

/** `npm run review -- <args>` against `address`, as a person runs it, with how long it took. */
function reviewCli(
  args: string[],
  address = env.address,
): Promise<{ stdout: string; stderr: string; code: number; ms: number }> {
  const started = Date.now();
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'review.ts'), ...args],
      {
        cwd: ROOT,
        timeout: 120_000,
        env: { ...process.env, TEMPORAL_ADDRESS: address, REVIEWER: 'ana', LOG_LEVEL: 'error' },
      },
      (err, stdout, stderr) =>
        resolve({
          stdout,
          stderr,
          code: err === null ? 0 : typeof err.code === 'number' ? err.code : -1,
          ms: Date.now() - started,
        }),
    );
  });
}

/** A GET of the page's queue: its status and body. */
function getPage(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    http
      .get(url, (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (chunk: string) => (body += chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      })
      .on('error', reject);
  });
}

/** A run that awaits review, as the queue finds it, on a task queue of its own (a worker must draft it). */
async function reviewedRun() {
  const local = await tempParts(defer);
  const taskQueue = `answers-${randomUUID()}`;
  const input = {
    ...(await pipelineInput(local.blobs, SAMPLE_TEXT)),
    review: { timeoutMinutes: 60, onTimeout: 'reject' as const },
  };
  const worker = await pipelineWorker(env, taskQueue, local.deps);
  const handle = await startPipeline(env, taskQueue, input);
  await worker.runUntil(async () => {
    const deadline = Date.now() + 60_000;
    while ((await handle.query(reviewQuery)) === undefined) {
      if (Date.now() > deadline) throw new Error('the draft never came to await review');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  });
  return { local, taskQueue, handle };
}

/** A run that the queue lists as awaiting review but that no worker can show: its workflow type is none. */
async function unreadableRun(taskQueue: string): Promise<string> {
  const workflowId = `document-unreadable-${randomUUID()}`;
  await env.client.workflow.start('noSuchWorkflowType', {
    taskQueue,
    workflowId,
    args: [],
    typedSearchAttributes: [{ key: REVIEW_STATUS, value: 'awaiting' }],
  });
  return workflowId;
}

describe('a run whose draft cannot be read', () => {
  it(
    'is shown with its error by npm run review and the page, and counted',
    { timeout: 180_000 },
    async () => {
      const { local, taskQueue } = await reviewedRun();
      const workflowId = await unreadableRun(taskQueue);
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      await worker.runUntil(async () => {
        const deadline = Date.now() + 30_000;
        let queue = await awaitingReview(env.client);
        while (!(queue.failed ?? []).some((run) => run.workflowId === workflowId)) {
          if (Date.now() > deadline)
            assert.fail(`the queue never said why ${workflowId} shows no draft: ${JSON.stringify(queue)}`);
          await new Promise((resolve) => setTimeout(resolve, 500));
          queue = await awaitingReview(env.client);
        }
        const listed = await reviewCli([]);
        assert.equal(listed.code, 1, listed.stdout + listed.stderr);
        assert.match(
          listed.stderr,
          new RegExp(`${workflowId} awaits review, but its draft could not be read: .+`),
        );

        const page = await startReviewPage(env.client, local.blobs, { port: 0, reviewer: 'ana' });
        defer(() => page.close());
        const shown = await getPage(page.url);
        assert.equal(shown.status, 200);
        assert.ok(
          shown.body.includes(`${workflowId} awaits review, but its draft could not be read`),
          shown.body,
        );
        const title = /<title>Review \((\d+)\)/.exec(shown.body);
        const now = await awaitingReview(env.client);
        const all = now.length + (now.unanswered ?? []).length + (now.failed ?? []).length;
        assert.equal(Number(title?.[1]), all, `the title counts every run awaiting review: ${title?.[0]}`);
      });
    },
  );
});

describe('with no worker up', () => {
  it(
    'npm run review says so and exits at its deadline; a decision is answered, not taken, and not applied later',
    { timeout: 240_000 },
    async () => {
      const { local, taskQueue, handle } = await reviewedRun();

      const listed = await reviewCli([]);
      assert.match(listed.stdout, /no worker answered for their drafts/);
      assert.ok(listed.stdout.includes(handle.workflowId), listed.stdout);
      // Its queries waited 5 s and were cancelled: the process does not hang on them (it took 30 s before).
      assert.ok(listed.ms < 25_000, `npm run review took ${listed.ms} ms with no worker`);

      const started = Date.now();
      const answer = await decide(env.client, handle.workflowId, { action: 'approve', reviewer: 'ana' });
      const tookMs = Date.now() - started;
      assert.equal(answer.ok, false);
      assert.match(
        answer.ok ? '' : answer.refused,
        /no worker took the decision within \d+ s, so it was not taken/,
      );
      assert.ok(tookMs < DECISION_WAIT_MS + 10_000, `the decision was answered after ${tookMs} ms`);

      // A worker starts: the decision sent earlier is refused by the run, not applied behind the reviewer's back.
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      await worker.runUntil(async () => {
        await new Promise((resolve) => setTimeout(resolve, 3_000));
        const draft = await handle.query(reviewQuery);
        assert.equal(draft?.decided, undefined, `applied later: ${JSON.stringify(draft?.decided)}`);

        // The time recorded is the reviewer's, not the worker's.
        const sentAt = Date.now() - 4_000;
        const decided = await decide(env.client, handle.workflowId, {
          action: 'approve',
          reviewer: 'ana',
          sentAt,
        });
        assert.ok(decided.ok, JSON.stringify(decided));
        assert.equal(decided.outcome.decidedAt, sentAt);
        assert.equal((await handle.result()).review?.decidedAt, sentAt);
      });
    },
  );
});

describe('names and servers', () => {
  it('a name that is no document run is refused, saying what to give', { timeout: 60_000 }, async () => {
    for (const name of ['', 'document-', 'document-a b'])
      assert.match(
        JSON.stringify(await decide(env.client, name, { action: 'approve', reviewer: 'ana' })),
        /names no document's run: give a document ID/,
      );
    const cli = await reviewCli(['approve', 'document-']);
    assert.equal(cli.code, 1);
    assert.match(cli.stderr, /names no document's run/);
  });

  it(
    'a server that goes down is said so by the page (503), within its deadline',
    { timeout: 120_000 },
    async () => {
      const other = await devServerEnv();
      let down = false;
      defer(() => (down ? undefined : other.teardown()));
      const local = await tempParts(defer);
      const page = await startReviewPage(other.client, local.blobs, { port: 0, reviewer: 'ana' });
      defer(() => page.close());
      assert.equal((await getPage(page.url)).status, 200);
      await other.teardown();
      down = true;
      const started = Date.now();
      const shown = await getPage(page.url);
      assert.equal(shown.status, 503, shown.body);
      assert.match(shown.body, /The Temporal server does not answer/);
      assert.ok(Date.now() - started < 30_000, `the page answered after ${Date.now() - started} ms`);
    },
  );

  it(
    'a server that is down is said so by npm run review, without a stack trace',
    { timeout: 120_000 },
    async () => {
      const closed = await new Promise<number>((resolve) => {
        const server = http.createServer().listen(0, '127.0.0.1', () => {
          const { port } = server.address() as { port: number };
          server.close(() => resolve(port));
        });
      });
      const listed = await reviewCli([], `127.0.0.1:${closed}`);
      assert.notEqual(listed.code, 0);
      assert.doesNotMatch(listed.stderr, /^\s+at /m, listed.stderr);
      assert.match(listed.stderr, /Temporal server|TEMPORAL_ADDRESS/i, listed.stderr);
    },
  );
});
