/**
 * A document's identity across edits, through submitDocument on the time-skipping server with a real worker: the
 * ID comes from the file's path and the content hash is the version, so an unchanged file is not run again, a
 * failed version is, an edit becomes the next revision of the same document, and a run of an older version still
 * under way is replaced.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { WorkflowFailedError } from '@temporalio/client';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { INPUT_SCHEMA_VERSION, workflowIdFor } from '../src/contract';
import type { PipelineOptions } from '../src/contract';
import { collectDocuments, versionOf } from '../src/documents/files';
import type { DocumentFile } from '../src/documents/files';
import { submitDocument } from '../src/runs/submit';
import type { Submission } from '../src/runs/submit';
import { documentPipeline } from '../workflows';
import { installQuietRuntime, pipelineWorker, SAMPLE_TEXT, tempParts, timeSkippingEnv } from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

const EDITED_TEXT = `${SAMPLE_TEXT}\n\nAn edit: retries reuse the key, so the target never writes a step twice.`;

let env: TestWorkflowEnvironment;
let root: string;
const defer = cleanupAfterAll();

before(async () => {
  // The failed-run test fails a workflow on purpose; the SDK logs that as a warning.
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
  root = scratchDir(defer, 'identity-test-');
});

/** Writes `text` to `name` under the root and collects it as the command line does, identified by its path. */
function writeDocument(name: string, text: string): DocumentFile {
  const file = path.join(root, name);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, text);
  const { documents, rejected } = collectDocuments([file], 1_000_000, { root });
  assert.deepEqual(rejected, []);
  const [document] = documents;
  assert.ok(document !== undefined, `${name} was not collected`);
  return document;
}

/**
 * Local parts, submitDocument to a fresh task queue, and `working(use)`, which runs a worker over the parts there
 * until `use` is done (made only then, so a test that fails before leaves no worker that was never run).
 */
async function pipeline() {
  const local = await tempParts(defer);
  const taskQueue = `identity-${randomUUID()}`;
  const submit = (document: DocumentFile, options?: Partial<PipelineOptions>): Promise<Submission> =>
    submitDocument(env.client, local.blobs, taskQueue, document, options);
  const working = async <T>(use: () => Promise<T>): Promise<T> =>
    (await pipelineWorker(env, taskQueue, local.deps)).runUntil(use);
  return { local, taskQueue, submit, working };
}

/** The run a submission is about: its ID, its status and the version its memo records. */
async function runOf(submission: Submission): Promise<{ runId: string; status: string; version: unknown }> {
  const { runId, status, memo } = await submission.handle.describe();
  return { runId, status: status.name, version: memo?.version };
}

/** The run ID of the latest run under a workflow ID: it moves only when a new run starts. */
async function latestRunId(workflowId: string): Promise<string> {
  return (await env.client.workflow.getHandle(workflowId).describe()).runId;
}

describe('submitting a document again', () => {
  it('publishes an edited file as revision 2 of the same document, and does not rerun an unchanged one', async () => {
    const { local, submit, working } = await pipeline();
    const original = writeDocument('edit/notes.md', SAMPLE_TEXT);
    assert.equal(original.documentId, 'edit:notes.md');

    const [first, second] = await working(async () => {
      const one = await submit(original);
      assert.equal(one.attachedTo, 'new');
      assert.equal((await one.handle.result()).publication?.revision, 1);
      const oneRun = await runOf(one);
      assert.equal(oneRun.version, versionOf(original.bytes), 'the run records the version it works on');

      const unchanged = await submit(writeDocument('edit/notes.md', SAMPLE_TEXT));
      assert.equal(unchanged.attachedTo, 'completed');
      assert.equal((await runOf(unchanged)).runId, oneRun.runId);
      assert.equal(await latestRunId(one.workflowId), oneRun.runId, 'an unchanged file started a new run');

      const edited = writeDocument('edit/notes.md', EDITED_TEXT);
      assert.equal(edited.documentId, original.documentId, 'the edit changed the document ID');
      const two = await submit(edited);
      assert.equal(two.attachedTo, 'new');
      assert.equal(two.workflowId, one.workflowId);
      assert.equal((await two.handle.result()).publication?.revision, 2);
      const twoRun = await runOf(two);
      assert.notEqual(twoRun.runId, oneRun.runId);
      assert.equal(twoRun.version, versionOf(edited.bytes));
      return [oneRun.runId, twoRun.runId];
    });

    assert.equal(await local.store.countPublications(), 1, 'the edit was published as another document');
    assert.equal((await local.store.currentPublication(original.documentId))?.revision, 2);
    assert.deepEqual(await local.store.revisionsOf(original.documentId), [
      { revision: 1, idempotencyKey: `${first}:publish` },
      { revision: 2, idempotencyKey: `${second}:publish` },
    ]);
  });

  it('reruns a version whose run failed, and then no more', async () => {
    const { local, submit, working } = await pipeline();
    const document = writeDocument('failed/notes.md', SAMPLE_TEXT);

    const [failedRunId, rerunId] = await working(async () => {
      // Options are not part of the version: this is the same version, failed by input the workflow refuses.
      const failed = await submit(document, { maxTags: 99 });
      assert.equal(failed.attachedTo, 'new');
      await assert.rejects(failed.handle.result(), WorkflowFailedError);

      const rerun = await submit(document);
      assert.equal(rerun.attachedTo, 'new');
      assert.equal(rerun.workflowId, failed.workflowId);
      assert.equal((await rerun.handle.result()).publication?.revision, 1);

      const again = await submit(document);
      assert.equal(again.attachedTo, 'completed');
      return [(await runOf(failed)).runId, (await runOf(rerun)).runId];
    });

    assert.notEqual(rerunId, failedRunId);
    assert.equal(await latestRunId(workflowIdFor(document.documentId)), rerunId);
    assert.equal((await local.store.currentPublication(document.documentId))?.revision, 1);
  });

  it('attaches to a run of the same version under way, and replaces one of an older version', async () => {
    const { local, submit, working } = await pipeline();
    // No worker polls yet, so the runs stay under way.
    const one = await submit(writeDocument('replace/notes.md', SAMPLE_TEXT));
    const same = await submit(writeDocument('replace/notes.md', SAMPLE_TEXT));
    assert.equal(one.attachedTo, 'new');
    assert.equal(same.attachedTo, 'running');
    assert.equal((await runOf(same)).runId, (await runOf(one)).runId);

    const edited = writeDocument('replace/notes.md', EDITED_TEXT);
    const two = await submit(edited);
    assert.equal(two.attachedTo, 'replaced');
    assert.equal(two.workflowId, one.workflowId);
    assert.equal((await runOf(one)).status, 'TERMINATED');
    assert.equal((await runOf(two)).version, versionOf(edited.bytes));

    const result = await working(() => two.handle.result());
    assert.equal(result.publication?.revision, 1, 'the replaced run published');
    assert.equal((await local.store.revisionsOf(edited.documentId)).length, 1);
  });

  it("gives two submitters of the same edit one run, neither ending the other's", async () => {
    const { submit, working } = await pipeline();
    const original = await submit(writeDocument('race/notes.md', SAMPLE_TEXT));
    const edited = writeDocument('race/notes.md', EDITED_TEXT);

    const both = await Promise.all([submit(edited), submit(edited)]);

    // One started the run and the other attached to it. The one that started it says it replaced the older run,
    // unless the other had ended that run before it looked: then it found nothing under way ('new').
    const labels = both.map((s) => s.attachedTo).sort();
    assert.ok(['new,running', 'replaced,running'].includes(labels.join()), `labels: ${labels.join(', ')}`);
    assert.equal((await runOf(original)).status, 'TERMINATED');
    const [a, b] = await Promise.all(both.map(runOf));
    assert.equal(a?.runId, b?.runId, 'the submitters ended up on two runs');
    assert.equal(a?.status, 'RUNNING');
    const [first] = both;
    assert.ok(first !== undefined);
    assert.equal((await working(() => first.handle.result())).publication?.revision, 1);
  });

  it('runs again over a run started before versions were recorded (no memo)', async () => {
    const { local, taskQueue, submit, working } = await pipeline();
    const document = writeDocument('legacy/notes.md', SAMPLE_TEXT);

    const resubmitted = await working(async () => {
      const legacy = await env.client.workflow.start(documentPipeline, {
        taskQueue,
        workflowId: workflowIdFor(document.documentId),
        args: [
          {
            schemaVersion: INPUT_SCHEMA_VERSION,
            documentId: document.documentId,
            textRef: await local.blobs.put(document.bytes),
            title: document.title,
            options: {},
          },
        ],
      });
      await legacy.result();
      const submission = await submit(document);
      await submission.handle.result();
      return submission;
    });

    assert.equal(resubmitted.attachedTo, 'new');
    assert.equal((await local.store.currentPublication(document.documentId))?.revision, 2);
  });
});
