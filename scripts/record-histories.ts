/**
 * `npm run record-histories -- <label> [documents...]`: records event histories for the replay tests.
 *
 * Starts a throwaway dev server, runs the pipeline with the offline model and the SQLite target in a temp data
 * folder, and writes each run's history to `test/histories/<label>-<document name>.json`, plus one run that
 * fails in its first step (`<label>-missing-text.json`). Record a new set
 * whenever the workflow changes shape (before and after a `patched()` change: for "before", record with the
 * `patched()` call replaced by `false`, then restore it), and commit it: the replay test then proves that
 * today's workflow code still replays every run yesterday's code left in a history.
 */
import '../src/cli/compose';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { historyToJSON } from '@temporalio/common/lib/proto-utils';
import type { WorkflowHandle } from '@temporalio/client';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { SAMPLES_DIR } from '../src/config';
import { submitDocument } from '../src/runs/submit';
import { loadConfig } from '../src/config';
import { createDependencies } from '../src/dependencies';
import { collectDocuments } from '../src/documents/files';
import { runMain } from '../src/lib/run-main';
import { INPUT_SCHEMA_VERSION, workflowIdFor } from '../src/contract';
import type { PipelineInput } from '../src/contract';
import { createPipelineWorker } from '../src/temporal/worker';
import { documentPipeline } from '../workflows';
import { startLocalDevServer } from '../src/temporal/local-server';

const HISTORIES_DIR = path.resolve(__dirname, '..', 'test', 'histories');
/** A document whose text is not in the blob store: summarize fails without retry, and so does the run. */
const MISSING_TEXT_INPUT: PipelineInput = {
  schemaVersion: INPUT_SCHEMA_VERSION,
  documentId: 'missing-text',
  textRef: `sha256:${'0'.repeat(64)}`,
  title: 'A document whose text was never stored',
};
const DEFAULT_DOCUMENTS = ['tidal-energy.md', 'sourdough-starter.md'].map((f) => path.join(SAMPLES_DIR, f));

async function run(): Promise<void> {
  const [label, ...given] = process.argv.slice(2);
  if (label === undefined || !/^[a-z0-9-]+$/.test(label)) {
    throw new Error(
      'Give a label for this set of histories (lowercase letters, digits, "-"), e.g. ' +
        '`npm run record-histories -- sequential`; files land in test/histories/<label>-<document>.json',
    );
  }
  // The missing-text run fails on purpose; the SDK would log each failed attempt as a warning.
  Runtime.install({ logger: new DefaultLogger('ERROR') });
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'record-histories-'));
  // Only DATA_DIR and the CLI path from the environment: always the offline model and the SQLite target.
  const config = loadConfig({
    DATA_DIR: dataDir,
    TEMPORAL_CLI_PATH: process.env.TEMPORAL_CLI_PATH,
    PATH: process.env.PATH,
  });
  const { documents, rejected } = collectDocuments(
    given.length > 0 ? given : DEFAULT_DOCUMENTS,
    config.maxDocumentBytes,
  );
  if (rejected.length > 0) {
    throw new Error(rejected.map((r) => `${r.source}: ${r.reason}`).join('\n'));
  }

  const env = await startLocalDevServer(config);
  const { deps, stores, close } = await createDependencies(config);
  try {
    const worker = await createPipelineWorker({
      connection: env.nativeConnection,
      namespace: env.namespace ?? 'default',
      taskQueue: config.taskQueue,
      deps,
      identity: 'record-histories',
    });
    const { blobs } = stores;
    const runs: {
      name: string;
      start(): Promise<WorkflowHandle<typeof documentPipeline>>;
      fails: boolean;
    }[] = [
      ...documents.map((document) => ({
        name: path.basename(document.source).replace(/\.[^.]+$/, ''),
        start: async () => (await submitDocument(env.client, blobs, config.taskQueue, document)).handle,
        fails: false,
      })),
      {
        // A failed run matters as much: a reset of it replays its history with the code of the day.
        name: 'missing-text',
        start: () =>
          env.client.workflow.start(documentPipeline, {
            taskQueue: config.taskQueue,
            workflowId: workflowIdFor('missing-text'),
            args: [MISSING_TEXT_INPUT],
          }),
        fails: true,
      },
    ];
    await worker.runUntil(async () => {
      fs.mkdirSync(HISTORIES_DIR, { recursive: true });
      for (const { name, start, fails } of runs) {
        const handle = await start();
        const failed = await handle.result().then(
          () => false,
          () => true,
        );
        if (failed !== fails) throw new Error(`run ${name} ${failed ? 'failed' : 'completed'} unexpectedly`);
        const file = path.join(HISTORIES_DIR, `${label}-${name}.json`);
        fs.writeFileSync(file, `${historyToJSON(await handle.fetchHistory())}\n`);
        console.log(`Recorded ${path.relative(process.cwd(), file)}`);
      }
    });
  } finally {
    await close();
    await env.teardown();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}

runMain(run);
