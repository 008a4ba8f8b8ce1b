/**
 * An agent step's loop under SIGKILLs, on a dev server with real worker processes: a worker killed after a tool's
 * effect and before its completion was recorded resumes without a second effect (the receiver's log), and a
 * worker killed during a model turn, after the answer was paid for, pays that turn once (the model server's log).
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { FileBlobStore } from '../src/documents/blobs';
import { ManifestWriter } from '../src/documents/manifest';
import type { AgentSettings } from '../src/contract';
import type { PipelineResult } from '../src/cli/compose';
import type { documentPipeline } from '../workflows';
import { startCrossReferenceServer } from '../demo/cross-reference-server';
import type { CrossReferenceServer } from '../demo/cross-reference-server';
import type { WorkerProcess } from '../demo/worker-process';
import {
  devServerEnv,
  pipelineInput,
  SAMPLE_TEXT,
  startCrashableWorker,
  startModelServer,
  writeWorkflowBundle,
} from './helpers';
import type { ModelServer } from './helpers';
import { plannedTurn } from './agent-model';
import { tempDir } from './scratch';

let env: TestWorkflowEnvironment;
let dir: string;
let bundlePath: string;
let xref: CrossReferenceServer;
let model: ModelServer;
const workers: WorkerProcess[] = [];

before(async () => {
  Runtime.install({ logger: new DefaultLogger('ERROR') });
  env = await devServerEnv();
  dir = tempDir('agent-crash-');
  bundlePath = await writeWorkflowBundle(dir);
  xref = await startCrossReferenceServer();
  model = await startModelServer((request) => plannedTurn(request));
});

after(async () => {
  for (const worker of workers) if (worker.child.exitCode === null) await worker.kill();
  await xref?.close();
  await model?.close();
  await env?.teardown();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

/** A document and its batch's manifest (the document and one other), with the loop's limits. */
async function agentInput(blobs: FileBlobStore) {
  const input = await pipelineInput(blobs, SAMPLE_TEXT);
  const manifest = new ManifestWriter(blobs);
  await manifest.add({
    documentId: input.documentId,
    textRef: input.textRef,
    title: input.title,
    source: 'test',
  });
  await manifest.add({
    documentId: 'other-0',
    textRef: await blobs.put(Buffer.from('Checkpoints and idempotency keys make retries safe.')),
    title: 'Checkpoints in practice',
    source: 'test',
  });
  const { manifestRef } = await manifest.finish();
  assert.ok(manifestRef !== undefined);
  const agent: AgentSettings = {
    maxTurns: 8,
    maxTokens: 200_000,
    historyEvents: 2_000,
    corpusRef: manifestRef,
  };
  return { ...input, agent };
}

function workerEnv(taskQueue: string, identity: string): Record<string, string> {
  return {
    TEMPORAL_ADDRESS: env.address,
    TEMPORAL_NAMESPACE: 'default',
    TEMPORAL_TASK_QUEUE: taskQueue,
    DATA_DIR: dir,
    OPENAI_BASE_URL: model.baseUrl,
    OPENAI_MODEL: 'test-model',
    PUBLISH_WEBHOOK_URL: '',
    CRASH_AFTER_PUBLISH: '',
    CRASH_AFTER_MEMO_WRITE: '',
    AGENT_TOOL_URL: xref.url,
    WORKFLOW_BUNDLE_PATH: bundlePath,
    WORKER_IDENTITY: identity,
  };
}

async function startWorker(extra: Record<string, string>): Promise<WorkerProcess> {
  const worker = await startCrashableWorker(extra);
  workers.push(worker);
  return worker;
}

describe('an agent loop under SIGKILL', () => {
  it(
    'resumes a tool call killed after its effect without a second effect',
    { timeout: 240_000 },
    async () => {
      const taskQueue = `agent-crash-${randomUUID()}`;
      const first = await startWorker(workerEnv(taskQueue, 'agent-crash-1'));
      // The receiver files the cross-reference, then the worker dies before it hears back.
      xref.afterEffect = async () => {
        xref.afterEffect = undefined;
        await first.kill();
      };
      const blobs = new FileBlobStore(path.join(dir, 'blobs'));
      const handle = await env.client.workflow.start<typeof documentPipeline>('documentPipeline', {
        taskQueue,
        workflowId: `agent-crash-${randomUUID()}`,
        args: [await agentInput(blobs)],
      });
      assert.equal(await first.exited, 'SIGKILL', first.output());
      const before = xref.effects.length;
      await startWorker(workerEnv(taskQueue, 'agent-crash-2'));
      const result = (await handle.result()) as PipelineResult;
      const key = `${handle.firstExecutionRunId}:related:call-2`;
      assert.equal(result.related?.agent.outcome, 'answered');
      assert.equal(result.related.crossReference, 'xref-1');
      assert.equal(before, 1);
      // The retry sent the same key again, and the receiver filed nothing new.
      assert.deepEqual(
        xref.effects.map((e) => e.key),
        [key],
      );
      assert.equal(xref.requests.filter((r) => r.key === key).length, 2, 'the call was not retried');
    },
  );

  it('pays a turn whose worker was killed after the answer once', { timeout: 240_000 }, async () => {
    const taskQueue = `agent-crash-${randomUUID()}`;
    const first = await startWorker({
      ...workerEnv(taskQueue, 'agent-crash-3'),
      // Memo keys read `<workflow ID>:<step>:turn-<n>:<hash>`: the kill comes once turn 2's answer is stored.
      CRASH_AFTER_MEMO_WRITE: 'turn-2',
    });
    const blobs = new FileBlobStore(path.join(dir, 'blobs'));
    const handle = await env.client.workflow.start<typeof documentPipeline>('documentPipeline', {
      taskQueue,
      workflowId: `agent-crash-${randomUUID()}`,
      args: [await agentInput(blobs)],
    });
    assert.equal(await first.exited, 'SIGKILL', first.output());
    await startWorker(workerEnv(taskQueue, 'agent-crash-4'));
    const result = (await handle.result()) as PipelineResult;
    const runId = handle.firstExecutionRunId;
    assert.equal(result.related?.agent.outcome, 'answered');
    assert.equal(result.related.agent.turns, 3);
    assert.equal(result.related.agent.memoisedTurns, 1, 'turn 2 was not read back from the memo');
    for (const turn of [1, 2, 3])
      assert.equal(
        model.requests.filter((r) => r.idempotencyKey === `${runId}:related:turn-${turn}`).length,
        1,
        `turn ${turn} was paid more than once`,
      );
  });
});
