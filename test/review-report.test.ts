/**
 * `npm run report` on reviewed runs: an edited run shows the fields the reviewer published, a rejected run says
 * publish did not run because of the rejection (not "not started yet"), and a run handed from one worker that
 * stopped cleanly (npm start's, at a review) to the next (npm run worker's) is not reported as a crash.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { decide } from '../src/runs/review-queue';
import type { ReviewDecision } from '../src/contract/review';
import { createPipelineWorker } from '../src/temporal/worker';
import { reviewQuery } from '../src/workflow';
import {
  devServerEnv,
  installQuietRuntime,
  pipelineInput,
  SAMPLE_TEXT,
  startPipeline,
  tempParts,
  workflowBundle,
} from './helpers';
import type { LocalParts } from './helpers';
import { cleanupAfterAll } from './scratch';

const ROOT = path.join(__dirname, '..');
const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

function report(workflowId: string): Promise<string> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'report.ts'), workflowId],
      {
        cwd: ROOT,
        timeout: 90_000,
        env: { ...process.env, TEMPORAL_ADDRESS: env.address, LOG_LEVEL: 'error' },
      },
      (_err, stdout, stderr) => resolve(stdout + stderr),
    );
  });
}

async function worker(local: LocalParts, taskQueue: string, identity: string) {
  return createPipelineWorker({
    connection: env.nativeConnection,
    namespace: env.namespace ?? 'default',
    taskQueue,
    deps: local.deps,
    workflowBundle: await workflowBundle(),
    identity,
  });
}

/** A run drafted by one worker, which then stops cleanly, and decided on the next; the report on it. */
async function handedOverAndDecided(decision: ReviewDecision): Promise<string> {
  const local = await tempParts(defer);
  const taskQueue = `review-report-${randomUUID()}`;
  const input = {
    ...(await pipelineInput(local.blobs, SAMPLE_TEXT)),
    review: { timeoutMinutes: 60, onTimeout: 'reject' as const },
  };
  const handle = await startPipeline(env, taskQueue, input);
  await (
    await worker(local, taskQueue, 'npm-start-worker')
  ).runUntil(async () => {
    const deadline = Date.now() + 60_000;
    while ((await handle.query(reviewQuery)) === undefined) {
      if (Date.now() > deadline) throw new Error('the draft never came to await review');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  });
  await (
    await worker(local, taskQueue, 'npm-run-worker')
  ).runUntil(async () => {
    const answer = await decide(env.client, handle.workflowId, decision);
    assert.ok(answer.ok, JSON.stringify(answer));
    await handle.result();
  });
  return report(handle.workflowId);
}

describe('npm run report on reviewed runs', () => {
  it(
    'shows the published edit, and a clean hand-off between workers as one',
    { timeout: 180_000 },
    async () => {
      const text = await handedOverAndDecided({
        action: 'edit',
        reviewer: 'ana',
        fields: { summary: 'A reviewed summary.' },
      });
      assert.match(text, /^Review: edited by ana at /m, text);
      assert.match(text, /published summary \(the reviewer's edit\): A reviewed summary\./, text);
      assert.match(text, /Handed over: .* npm-run-worker went on from npm-start-worker .*not a crash/, text);
      assert.doesNotMatch(text, /Resumed:/, text);
    },
  );

  it('says a rejected run did not publish because of the rejection', { timeout: 180_000 }, async () => {
    const text = await handedOverAndDecided({ action: 'reject', reviewer: 'ana', reason: 'off topic' });
    assert.match(
      text,
      /^publish: not run: the review rejected the draft \(rejected \("off topic"\) by ana/m,
      text,
    );
    assert.doesNotMatch(text, /not started yet/, text);
  });
});
