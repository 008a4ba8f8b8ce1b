/**
 * Drafts waiting for a person hold no slot of the batch's window: 40 documents under review with the default
 * window (BATCH_WINDOW, 16) all reach review, and the client says so; before, 16 held the window, the other 24
 * never started, and the client counted them nowhere.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig } from '../src/config';
import { processDocuments } from '../src/runs/batch';
import { REVIEW_EXIT_CODE } from '../src/runs/result-table';
import { devServerEnv, installQuietRuntime, pipelineWorker, SAMPLE_TEXT, tempParts } from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

const DOCUMENTS = 40;
const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

describe('a batch under review', () => {
  it(
    `starts all ${DOCUMENTS} documents with the default window, and each awaits review`,
    { timeout: 480_000 },
    async () => {
      const local = await tempParts(defer);
      const dir = scratchDir(defer, 'review-window-');
      const files = Array.from({ length: DOCUMENTS }, (_, i) => {
        const file = path.join(dir, `doc-${i}.md`);
        fs.writeFileSync(file, `# Document ${i} ${randomUUID()}\n\n${SAMPLE_TEXT}\n`);
        return file;
      });
      const taskQueue = `review-window-${randomUUID()}`;
      const config = loadConfig({ DATA_DIR: local.dir, TEMPORAL_TASK_QUEUE: taskQueue, REVIEW: 'on' });
      assert.equal(config.batchWindow, 16, 'the default window');
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      await worker.runUntil(async () => {
        const lines: string[] = [];
        const report = await processDocuments(env.client, config, local.blobs, files, {
          everyMs: 500,
          print: (line) => lines.push(line),
          signal: AbortSignal.timeout(360_000),
        });
        const text = lines.join('\n');
        assert.equal(report.exitCode, REVIEW_EXIT_CODE, text);
        assert.match(text, new RegExp(`^${DOCUMENTS} document\\(s\\) await review`, 'm'), text);
        assert.doesNotMatch(text, /not yet started/, text);
        assert.equal(lines.filter((line) => line.startsWith('AWAITING REVIEW ')).length, DOCUMENTS, text);
      });
    },
  );
});
