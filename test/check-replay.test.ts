/**
 * `npm run check-replay` against a live dev server: runs recorded by the code before the parallel-model-steps patch
 * and after it, checked with the working tree's workflows and with a copy that reorders two steps. It must name
 * the run a nondeterministic change breaks (and exit non-zero), and say of the patch whether a run still needs its
 * old branch.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { createPipelineWorker } from '../src/temporal/worker';
import {
  devServerEnv,
  installQuietRuntime,
  pipelineInput,
  pipelineWorker,
  SAMPLE_TEXT,
  workflowsWithWorkflowModule,
  startPipeline,
  tempParts,
} from './helpers';
import type { LocalParts } from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

installQuietRuntime();
const defer = cleanupAfterAll();
const ROOT = path.join(__dirname, '..');

/** `npm run check-replay -- <args>` on `taskQueue` of the test's server: its exit code and output. */
function checkReplay(
  env: TestWorkflowEnvironment,
  taskQueue: string,
  args: string[] = [],
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'check-replay.ts'), ...args],
      {
        cwd: ROOT,
        env: { ...process.env, TEMPORAL_ADDRESS: env.address, TEMPORAL_TASK_QUEUE: taskQueue },
        timeout: 120_000,
        killSignal: 'SIGKILL',
      },
      (err, stdout, stderr) => {
        const code = err === null ? 0 : typeof err.code === 'number' ? err.code : null;
        resolve({ code, output: `${stdout}${stderr}` });
      },
    );
  });
}

/** Waits until the server's visibility lists `count` runs on `taskQueue` (listing lags a run's close a little). */
async function listed(env: TestWorkflowEnvironment, taskQueue: string, count: number): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const { count: seen } = await env.client.workflow.count(`TaskQueue = '${taskQueue}'`);
    if (seen >= count) return;
    if (Date.now() > deadline) throw new Error(`visibility lists ${seen} of ${count} runs on ${taskQueue}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** A copy of workflows/ in which the sequential path runs tag before summarize: a change replay must refuse. */
function reorderedWorkflows(): string {
  const dir = scratchDir(defer, 'check-replay-');
  fs.cpSync(path.join(ROOT, 'workflows'), path.join(dir, 'workflows'), { recursive: true });
  // The copy imports ../src and ../activities as the original does.
  for (const linked of ['src', 'activities', 'node_modules']) {
    fs.symlinkSync(path.join(ROOT, linked), path.join(dir, linked));
  }
  const file = path.join(dir, 'workflows', 'index.ts');
  const source = fs.readFileSync(file, 'utf8');
  const sequential = '      : [await summarize(), await tag()];\n';
  assert.ok(
    source.includes(sequential),
    'the sequential path of workflows/index.ts changed: update this test',
  );
  fs.writeFileSync(
    file,
    source.replace(
      sequential,
      '      : await tag().then(async (tags) => [await summarize(), tags] as const);\n',
    ),
  );
  return path.join(dir, 'workflows');
}

describe('npm run check-replay', () => {
  let env: TestWorkflowEnvironment;
  let local: LocalParts;
  /** A task queue with one run recorded before the patch, and one after. */
  const mixed = `check-replay-${randomUUID()}`;
  /** A task queue with runs recorded after the patch only. */
  const patchedOnly = `check-replay-${randomUUID()}`;

  before(async () => {
    env = await devServerEnv();
    defer(() => env.teardown());
    local = await tempParts(defer);
    // The code before the patch: the same workflows, with patched() answering false and recording nothing.
    const before = await workflowsWithWorkflowModule(require.resolve('./fixtures/patch-absent'));
    const old = await createPipelineWorker({
      connection: env.nativeConnection,
      namespace: env.namespace ?? 'default',
      taskQueue: mixed,
      deps: local.deps,
      workflowBundle: before,
    });
    await old.runUntil(async () => {
      const handle = await startPipeline(env, mixed, await pipelineInput(local.blobs, SAMPLE_TEXT));
      await handle.result();
    });
    for (const taskQueue of [mixed, patchedOnly]) {
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      await worker.runUntil(async () => {
        const handle = await startPipeline(env, taskQueue, await pipelineInput(local.blobs, SAMPLE_TEXT));
        await handle.result();
      });
    }
    await listed(env, mixed, 2);
    await listed(env, patchedOnly, 1);
  });

  it('replays runs from both sides of the patch, and says the old branch is still needed by the older', async () => {
    const { code, output } = await checkReplay(env, mixed);
    assert.equal(code, 0, output);
    assert.match(output, /2 runs replayed, none would break/);
    assert.match(output, /patched\('parallel-model-steps'\): still needed, 1 run took the old branch: wf-/);
  });

  it('names the run a reordered step breaks, and exits non-zero', async () => {
    const { code, output } = await checkReplay(env, mixed, ['--workflows', reorderedWorkflows()]);
    assert.equal(code, 1, output);
    assert.match(
      output,
      /^BREAKS wf-\S+ \(run \S+, completed\): DeterminismViolationError: .*Nondeterminism/m,
    );
    assert.match(output, /2 runs replayed, 1 run would break/);
  });

  it('says the old branch may go once only runs with the marker are left, and the call once none is', async () => {
    const marked = await checkReplay(env, patchedOnly);
    assert.equal(marked.code, 0, marked.output);
    assert.match(
      marked.output,
      /patched\('parallel-model-steps'\): no run needs the old branch; 1 run recorded the marker: replace it with deprecatePatch/,
    );

    const none = await checkReplay(env, `check-replay-empty-${randomUUID()}`);
    assert.equal(none.code, 0, none.output);
    assert.match(none.output, /0 runs replayed, none would break/);
    assert.match(none.output, /patched\('parallel-model-steps'\): no longer needed/);
  });

  it('refuses a window it cannot read', async () => {
    const { code, output } = await checkReplay(env, patchedOnly, ['--since', 'soon']);
    assert.equal(code, 1, output);
    assert.match(output, /--since \\?"soon\\?" is not a duration/);
  });
});
