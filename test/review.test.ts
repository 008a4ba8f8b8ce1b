/**
 * A person's review on the dev server: a batch with REVIEW=on stops at review with its own exit code and the
 * command to run; `npm run review` lists the drafts and approves, edits and rejects them; the runs finish by
 * themselves. The update's guarantees: a malformed decision is refused and leaves nothing in the history, the same
 * update ID sent twice is answered once, two reviewers at once get one winner, and a run waits out a worker that
 * went away.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig } from '../src/config';
import { workflowIdFor } from '../src/contract';
import type { PipelineResult } from '../src/cli/compose';
import { documentIdOf } from '../src/documents/files';
import { processDocuments } from '../src/runs/batch';
import { REVIEW_EXIT_CODE } from '../src/runs/result-table';
import { decide } from '../src/runs/review-queue';
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
import { cleanupAfterAll, scratchDir } from './scratch';

const run = promisify(execFile);
const ROOT = path.join(__dirname, '..');
const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

/** `npm run review -- <args>` against the test's server, as a person runs it. */
async function reviewCli(
  args: string[],
  reviewer = 'ana',
): Promise<{ stdout: string; stderr: string; code: number }> {
  try {
    const { stdout, stderr } = await run(
      process.execPath,
      ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'review.ts'), ...args],
      {
        cwd: ROOT,
        timeout: 60_000,
        env: { ...process.env, TEMPORAL_ADDRESS: env.address, REVIEWER: reviewer, LOG_LEVEL: 'error' },
      },
    );
    return { stdout, stderr, code: 0 };
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string; code?: number };
    return { stdout: e.stdout ?? '', stderr: e.stderr ?? '', code: e.code ?? -1 };
  }
}

/** Polls `npm run review` until it lists every one of `documentIds` (the server's index lags by a moment). */
async function listedByCli(documentIds: readonly string[]): Promise<string> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const { stdout } = await reviewCli([]);
    if (documentIds.every((id) => stdout.includes(id))) return stdout;
    if (Date.now() > deadline)
      throw new Error(`npm run review never listed ${documentIds.join(', ')}:\n${stdout}`);
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

/** A document stored in fresh local parts, its input asking for a review, and a task queue of its own. */
async function reviewedDocument() {
  const local = await tempParts(defer);
  const input = {
    ...(await pipelineInput(local.blobs, SAMPLE_TEXT)),
    review: { timeoutMinutes: 60, onTimeout: 'reject' as const },
  };
  return { local, taskQueue: `review-${randomUUID()}`, input };
}

/** Waits (30 s at most) until the run's draft awaits review. */
async function draftReady(handle: { query: (q: typeof reviewQuery) => Promise<unknown> }): Promise<void> {
  const deadline = Date.now() + 30_000;
  while ((await handle.query(reviewQuery)) === undefined) {
    if (Date.now() > deadline) throw new Error('the draft never came to await review');
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe('REVIEW=on on the dev server', () => {
  it(
    'stops the batch at review (exit code 6), and npm run review approves, edits and rejects',
    { timeout: 240_000 },
    async () => {
      const local = await tempParts(defer);
      const dir = scratchDir(defer, 'review-');
      const files = ['approve.md', 'edit.md', 'reject.md'].map((name) => path.join(dir, name));
      for (const file of files)
        fs.writeFileSync(file, `# ${path.basename(file)} ${randomUUID()}\n\n${SAMPLE_TEXT}\n`);
      const [approveId, editId, rejectId] = files.map((file) => documentIdOf(file)) as [
        string,
        string,
        string,
      ];
      const taskQueue = `review-${randomUUID()}`;
      const config = loadConfig({ DATA_DIR: local.dir, TEMPORAL_TASK_QUEUE: taskQueue, REVIEW: 'on' });
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      await worker.runUntil(async () => {
        const lines: string[] = [];
        const report = await processDocuments(env.client, config, local.blobs, files, {
          everyMs: 200,
          print: (line) => lines.push(line),
          signal: AbortSignal.timeout(90_000),
        });
        const text = lines.join('\n');
        assert.equal(report.exitCode, REVIEW_EXIT_CODE, text);
        assert.match(text, /3 document\(s\) await review/);
        assert.match(text, /^REVIEW npm run review/m);
        assert.equal(await local.store.countPublications(), 0, 'published before review');

        const listed = await listedByCli([approveId, editId, rejectId]);
        assert.match(listed, /summary: /);
        assert.match(listed, /tags: /);

        const shown = await run(
          process.execPath,
          ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'report.ts'), workflowIdFor(approveId)],
          {
            cwd: ROOT,
            timeout: 60_000,
            env: { ...process.env, TEMPORAL_ADDRESS: env.address, LOG_LEVEL: 'error' },
          },
        );
        assert.match(shown.stdout, /^Review: ⏸ awaiting since .*npm run review$/m, shown.stdout);

        const approved = await reviewCli(['approve', approveId]);
        assert.equal(approved.code, 0, approved.stderr);
        assert.match(approved.stdout, new RegExp(`${approveId}: approved by ana at `));
        const edited = await reviewCli([
          'edit',
          editId,
          '--summary',
          'A reviewed summary.',
          '--tags',
          'one, two',
        ]);
        assert.equal(edited.code, 0, edited.stderr);
        const rejected = await reviewCli(['reject', rejectId, '--reason', 'off topic']);
        assert.equal(rejected.code, 0, rejected.stderr);
        assert.match(rejected.stdout, /rejected \("off topic"\) by ana/);
        // The name a decision records is the configured identity: a typed --reviewer is refused, saying what to set.
        const typed = await reviewCli(['approve', rejectId, '--reviewer', 'bo']);
        assert.notEqual(typed.code, 0);
        assert.match(typed.stderr, /--reviewer is not accepted: .*Set REVIEWER/);
        const again = await reviewCli(['approve', rejectId], 'bo');
        assert.equal(again.code, 1);
        assert.match(again.stderr, /refused: .*already decided: rejected \("off topic"\) by ana/);
        const malformed = await reviewCli(['reject', approveId]);
        assert.notEqual(malformed.code, 0);
        assert.match(malformed.stderr, /reject needs --reason/);

        const resultOf = (id: string): Promise<PipelineResult> =>
          env.client.workflow.getHandle(workflowIdFor(id)).result();
        const [a, e, r] = await Promise.all([resultOf(approveId), resultOf(editId), resultOf(rejectId)]);
        assert.equal(a.review?.outcome, 'approved');
        assert.equal(a.publication?.revision, 1);
        assert.equal(e.review?.outcome, 'edited');
        const stored = await local.store.currentPublication(editId);
        assert.equal(stored?.fields.summary, 'A reviewed summary.');
        assert.deepEqual(stored?.fields.tags, ['one', 'two']);
        assert.equal((stored?.fields.review as { reviewer?: string }).reviewer, 'ana');
        assert.equal(r.review?.outcome, 'rejected');
        assert.equal(r.review?.reason, 'off topic');
        assert.equal(r.publication, undefined);
        assert.equal(
          await local.store.currentPublication(rejectId),
          undefined,
          'a rejected draft was published',
        );
        assert.equal(await local.store.countPublications(), 2);
      });
    },
  );

  it(
    'refuses a malformed decision without a trace, answers the same update ID once, and waits out a worker that went away',
    { timeout: 120_000 },
    async () => {
      const { local, taskQueue, input } = await reviewedDocument();
      // The first worker goes away while the draft waits; the decision is taken by the next one.
      const first = await pipelineWorker(env, taskQueue, local.deps);
      const handle = await startPipeline(env, taskQueue, input);
      await first.runUntil(draftReady(handle));
      const second = await pipelineWorker(env, taskQueue, local.deps);
      await second.runUntil(async () => {
        const bad = await decide(env.client, handle.workflowId, { action: 'approve', reviewer: ' ' });
        assert.deepEqual(bad, { ok: false, refused: bad.ok ? '' : bad.refused });
        assert.match(bad.ok ? '' : bad.refused, /invalid decision: "reviewer" must name who decides/);
        const badEdit = await decide(env.client, handle.workflowId, {
          action: 'edit',
          reviewer: 'ana',
          fields: { headline: 'no such field' },
        });
        assert.match(badEdit.ok ? '' : badEdit.refused, /"headline" is not a field of this draft/);

        const updateId = `click-${randomUUID()}`;
        const decision = { action: 'approve' as const, reviewer: 'ana' };
        const [one, two] = await Promise.all([
          decide(env.client, handle.workflowId, decision, updateId),
          decide(env.client, handle.workflowId, decision, updateId),
        ]);
        assert.ok(one.ok && two.ok, 'the same update ID sent twice was refused');
        assert.deepEqual(one.outcome, two.outcome);
        const other = await decide(env.client, handle.workflowId, {
          action: 'reject',
          reviewer: 'bo',
          reason: 'no',
        });
        assert.match(other.ok ? '' : other.refused, /already decided: approved by ana at /);

        const result = await handle.result();
        assert.equal(result.review?.outcome, 'approved');
        assert.equal(result.publication?.revision, 1);
        const events = (await handle.fetchHistory()).events ?? [];
        const accepted = events.filter((ev) => ev.workflowExecutionUpdateAcceptedEventAttributes);
        assert.equal(accepted.length, 1, 'refused or repeated decisions were written to the history');
      });
      assert.equal(await local.store.countPublications(), 1);
    },
  );

  it(
    'lets exactly one of two reviewers deciding at once win; the other is told who did',
    { timeout: 120_000 },
    async () => {
      const { local, taskQueue, input } = await reviewedDocument();
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      const handle = await startPipeline(env, taskQueue, input);
      await worker.runUntil(async () => {
        await draftReady(handle);
        const answers = await Promise.all([
          decide(env.client, handle.workflowId, { action: 'approve', reviewer: 'ana' }),
          decide(env.client, handle.workflowId, { action: 'reject', reviewer: 'bo', reason: 'too long' }),
        ]);
        const won = answers.filter((a) => a.ok);
        const lost = answers.filter((a) => !a.ok);
        assert.equal(won.length, 1, JSON.stringify(answers));
        assert.equal(lost.length, 1, JSON.stringify(answers));
        assert.match(
          lost[0]!.ok ? '' : lost[0]!.refused,
          /already decided: (approved by ana|rejected \("too long"\) by bo)/,
        );
        const result = await handle.result();
        assert.equal(result.review?.outcome, won[0]!.ok ? won[0]!.outcome.outcome : undefined);
      });
    },
  );
});
