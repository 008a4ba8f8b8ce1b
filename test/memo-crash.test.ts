/**
 * A paid model answer survives a crash: a worker process memoises the summarize answer and is SIGKILLed before the
 * activity returns; the retry on the next worker reads the answer back instead of calling the model again. Then
 * the report command (`npm run report -- <workflow ID>`) is run as a real process against the same server.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { FileBlobStore } from '../src/documents/blobs';
import { SqliteAnswerMemo } from '../src/model/memo-store';
import { recoveryReport } from '../src/runs/history';
import { describeStep } from '../src/runs/step-outcome';
import type { PipelineResult } from '../src/cli/compose';
import type { documentPipeline } from '../workflows';

import type { WorkerProcess } from '../demo/worker-process';
import {
  completion,
  devServerEnv,
  isTagRequest,
  pipelineInput,
  SAMPLE_TEXT,
  startCrashableWorker,
  startModelServer,
  writeWorkflowBundle,
} from './helpers';
import { tempDir } from './scratch';
import type { ModelServer } from './helpers';

const run = promisify(execFile);
const ROOT = path.resolve(__dirname, '..');

let env: TestWorkflowEnvironment;
let dir: string;
let bundlePath: string;
let model: ModelServer;
const workers: WorkerProcess[] = [];

before(async () => {
  Runtime.install({ logger: new DefaultLogger('ERROR') });
  env = await devServerEnv();
  dir = tempDir('memo-crash-');
  bundlePath = await writeWorkflowBundle(dir);
  model = await startModelServer((request) =>
    isTagRequest(request)
      ? { body: completion('{"tags": ["checkpoints", "idempotency"]}') }
      : { body: completion('Checkpoints let a restart skip finished steps.') },
  );
});

after(async () => {
  for (const worker of workers) if (worker.child.exitCode === null) await worker.kill();
  await model?.close();
  await env?.teardown();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

/** Runs `npm run report -- <workflow ID>` (the same script, as a real process) against the test server. */
async function reportCommand(workflowId: string): Promise<string> {
  const { stdout } = await run(process.execPath, ['--import', 'tsx', 'src/cli/report.ts', workflowId], {
    cwd: ROOT,
    env: { ...process.env, TEMPORAL_ADDRESS: env.address, TEMPORAL_NAMESPACE: 'default' },
  });
  return stdout;
}

describe('a crash right after the model answer was memoised', () => {
  const taskQueue = `memo-crash-${randomUUID()}`;
  const workflowId = `memo-crash-${randomUUID()}`;
  let result: PipelineResult;
  let runId: string;

  it('pays for the summarize answer once and reuses it on the retry', { timeout: 120_000 }, async () => {
    const workerEnv = (identity: string): Record<string, string> => ({
      TEMPORAL_ADDRESS: env.address,
      TEMPORAL_NAMESPACE: 'default',
      TEMPORAL_TASK_QUEUE: taskQueue,
      DATA_DIR: dir,
      OPENAI_BASE_URL: model.baseUrl,
      OPENAI_MODEL: 'test-model',
      PUBLISH_WEBHOOK_URL: '',
      WORKFLOW_BUNDLE_PATH: bundlePath,
      WORKER_IDENTITY: identity,
    });
    const crashing = await startCrashableWorker({
      ...workerEnv('memo-crash-worker-1'),
      CRASH_AFTER_MEMO_WRITE: 'summarize',
    });
    workers.push(crashing);
    const blobs = new FileBlobStore(path.join(dir, 'blobs'));
    const handle = await env.client.workflow.start<typeof documentPipeline>('documentPipeline', {
      taskQueue,
      workflowId,
      args: [await pipelineInput(blobs, SAMPLE_TEXT)],
    });
    runId = handle.firstExecutionRunId;

    assert.equal(await crashing.exited, 'SIGKILL', crashing.output());
    // Memo keys read `<workflow ID>:<step>:<request hash>`: no run ID, so a later run of the document finds it.
    assert.match(crashing.output(), new RegExp(`CRASH after memoising ${workflowId}:summarize:[0-9a-f]{32}`));

    // While no worker runs, the report shows the run as open, with the dead worker's attempt still pending.
    const open = await reportCommand(workflowId);
    assert.match(open, /^Outcome: running \(started .*\)$/m);
    assert.match(open, /^summarize: running; in progress: attempt [12] (started|scheduled)$/m);

    workers.push(await startCrashableWorker(workerEnv('memo-crash-worker-2')));
    result = await handle.result();

    const summarizeRequests = model.requests.filter((r) => r.idempotencyKey === `${runId}:summarize`);
    assert.equal(summarizeRequests.length, 1, 'the model saw exactly one summarize request across the crash');
    assert.equal(result.summary.memoised, true);
    assert.equal(result.summary.idempotencyKey, `${runId}:summarize`);
    assert.equal(result.summary.summary, 'Checkpoints let a restart skip finished steps.');
    assert.deepEqual(result.tags.tags, ['checkpoints', 'idempotency']);
    assert.equal(result.publication?.revision, 1);

    const memo = new SqliteAnswerMemo(path.join(dir, 'memo.db'));
    try {
      assert.equal(await memo.count(), 2, 'one stored answer per model step');
    } finally {
      await memo.close();
    }

    const report = recoveryReport(await handle.fetchHistory(), 0);
    const summarize = report.steps.find((s) => s.step === 'summarize');
    assert.ok(summarize);
    assert.equal(summarize.status, 'completed');
    assert.equal(summarize.memoised, true);
    assert.equal(summarize.attempts, 2);
    assert.equal(summarize.worker, 'memo-crash-worker-2');
    assert.match(summarize.lastFailure ?? '', /heartbeat/i);
    assert.equal(describeStep(summarize), 'reused memoised answer (attempt 2)');
    assert.ok(report.workers.includes('memo-crash-worker-1'), report.workers.join(', '));
    assert.ok(report.workers.includes('memo-crash-worker-2'), report.workers.join(', '));
  });

  it('`npm run report` prints the recovery of each step from the history', { timeout: 60_000 }, async () => {
    assert.ok(result, 'needs the run of the previous test');
    const stdout = await reportCommand(workflowId);
    const lines = stdout.split('\n');
    assert.ok(lines.includes(`Workflow ${workflowId}, run ${runId}`), stdout);
    assert.match(stdout, /^Outcome: completed at .*; published as revision 1$/m);
    assert.match(stdout, /^Workers that touched the run: .*memo-crash-worker-1/m);
    assert.match(stdout, /^Workers that touched the run: .*memo-crash-worker-2/m);
    assert.match(stdout, /^summarize: completed; reused from the memo: attempt 2 read back the answer/m);
    assert.match(stdout, /^ {2}attempts: +2$/m);
    assert.match(stdout, /^ {2}worker: +memo-crash-worker-2 \(ran the recorded attempt\)$/m);
    assert.ok(lines.includes(`  key:          ${runId}:summarize`), stdout);
    assert.match(stdout, /^ {2}time lost: +\d+\.\d s between scheduling and the recorded attempt$/m);
    assert.match(stdout, /^ {2}last failure: activity Heartbeat timeout$/im);
    assert.ok(lines.includes(`  key:          ${runId}:publish`), stdout);
  });

  it(
    '`npm run report` exits non-zero and says so when the workflow does not exist',
    { timeout: 60_000 },
    async () => {
      const missing = `no-such-workflow-${randomUUID()}`;
      await assert.rejects(reportCommand(missing), (err: { code?: number; stderr?: string }) => {
        assert.equal(err.code, 1);
        assert.match(err.stderr ?? '', new RegExp(`No workflow "${missing}" in namespace "default"`));
        return true;
      });
    },
  );
});
