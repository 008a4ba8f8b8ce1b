/**
 * A batch whose window fills with a held run tells the documents it never started from failed ones; and a
 * resubmission that attaches to a held run shows it held: a second batch (another manifest) that finds the
 * document's run under way and held prints the HELD line, as the first did, and ends with the held exit code
 * instead of waiting on the run without a word.
 */
import '../src/cli/compose';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig } from '../src/config';
import { workflowIdFor } from '../src/contract';
import { documentIdOf } from '../src/documents/files';
import { processDocuments } from '../src/runs/batch';
import {
  closeServer,
  devServerEnv,
  installQuietRuntime,
  listenOnLoopback,
  pipelineWorker,
  SAMPLE_TEXT,
  scratchLedger,
  tempParts,
  webhookPublisher,
} from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

/** A receiver that ignores keys and loses its answer to `heldId`'s first POST (after applying it). */
async function receiverLosing(heldId: string): Promise<{ url: string; heldPosts: () => number }> {
  let heldPosts = 0;
  const receiver = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const { documentId } = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { documentId: string };
      if (documentId === heldId && ++heldPosts === 1) return void req.socket.destroy();
      res.writeHead(201, { 'content-type': 'application/json' }).end('{"revision": 1}');
    });
  });
  const origin = await listenOnLoopback(receiver);
  defer(() => closeServer(receiver));
  return { url: `${origin}/publications`, heldPosts: () => heldPosts };
}

/**
 * A worker whose webhook loses the answer to `heldId`'s first POST (so its delivery is held, policy `hold`), and
 * a client that runs batches on it with `settings`, collecting what it prints.
 */
async function pipelineHolding(heldId: string, settings: Record<string, string> = {}) {
  const receiver = await receiverLosing(heldId);
  const publisher = webhookPublisher(defer, receiver.url, {
    ledger: scratchLedger(defer),
    policy: 'hold',
    timeoutMs: 1_000,
  });
  const local = await tempParts(defer, { publisher });
  const taskQueue = `held-${randomUUID()}`;
  const config = loadConfig({ DATA_DIR: local.dir, TEMPORAL_TASK_QUEUE: taskQueue, ...settings });
  const worker = await pipelineWorker(env, taskQueue, local.deps);
  const batch = async (files: string[]) => {
    const lines: string[] = [];
    const report = await processDocuments(env.client, config, local.blobs, files, {
      everyMs: 200,
      print: (line) => lines.push(line),
      signal: AbortSignal.timeout(60_000),
    });
    return { lines, text: lines.join('\n'), exitCode: report.exitCode };
  };
  return { receiver, worker, batch };
}

describe('a batch whose window fills with a held run', () => {
  it(
    'lists the documents it never started as not started, never as failed (BATCH_WINDOW=1)',
    { timeout: 150_000 },
    async () => {
      const dir = scratchDir(defer, 'held-window-');
      const files = ['a-held.md', 'b.md', 'c.md'].map((name) => path.join(dir, name));
      for (const file of files)
        fs.writeFileSync(file, `# ${path.basename(file)} ${randomUUID()}\n\n${SAMPLE_TEXT}\n`);
      const heldId = documentIdOf(files[0]!);
      const { worker, batch } = await pipelineHolding(heldId, { BATCH_WINDOW: '1' });
      await worker.runUntil(async () => {
        const { lines, text, exitCode } = await batch(files);
        assert.equal(exitCode, 4, text);
        assert.deepEqual(
          lines.filter((l) => l.startsWith('FAILED ')),
          [],
          text,
        );
        assert.match(
          text,
          /0 of 3 document\(s\) published, 1 held for a verdict on their delivery, 2 not started yet/,
        );
        await env.client.workflow.getHandle(workflowIdFor(heldId)).terminate('the test is over');
      });
    },
  );
});

describe('a resubmission that attaches to a held run', () => {
  it('prints the HELD line and ends with exit code 4', { timeout: 150_000 }, async () => {
    const dir = scratchDir(defer, 'attach-held-');
    const heldFile = path.join(dir, 'held.md');
    const otherFile = path.join(dir, 'other.md');
    fs.writeFileSync(heldFile, `# Held ${randomUUID()}\n\n${SAMPLE_TEXT}\n`);
    fs.writeFileSync(otherFile, `# Other ${randomUUID()}\n\n${SAMPLE_TEXT}\n`);
    const heldId = documentIdOf(heldFile);
    const { receiver, worker, batch } = await pipelineHolding(heldId);
    const heldLine = (lines: string[]) => lines.filter((l) => l.startsWith(`HELD ${heldFile}: `));

    await worker.runUntil(async () => {
      const first = await batch([heldFile]);
      assert.equal(first.exitCode, 4, first.text);
      assert.ok(heldLine(first.lines).length > 0, first.text);

      // Another batch (the held document and one more) attaches to the held run rather than starting it again.
      const { lines: again, text, exitCode } = await batch([heldFile, otherFile]);
      assert.match(text, new RegExp(`document-${heldId} \\(resuming the run already under way\\)`));
      assert.ok(heldLine(again).length > 0, text);
      assert.equal(exitCode, 4, text);
      assert.match(text, /1 of 2 document\(s\) published, 1 held for a verdict on their delivery, 0 failed/);
      assert.equal(receiver.heldPosts(), 1, 'the held delivery was posted again');
      // Ends the held run, so the second batch's wait on it (an activity) ends before the worker stops.
      await env.client.workflow.getHandle(workflowIdFor(heldId)).terminate('the test is over');
    });
  });
});
