/**
 * The structure, proven by use: docs/add-a-step.md adds a fourth step, one that asks the model something new, as
 * one folder of its own (one typed definition and its offline answer), its line in the step list and its call in
 * the workflow. This test applies exactly those patches to a copy of the repository and shows that they are
 * enough: the copy type-checks (but for the two tests that write out a whole result, which the guide names), its
 * pipeline runs all four steps on a real (time-skipping) Temporal server, on the offline model and on the demo's
 * model server, with the new step's result, key, cost, column and publication field reported by the unchanged
 * kit, and the committed histories of older runs still replay against it.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { bundleWorkflowCode, Worker } from '@temporalio/worker';
import type { WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { installQuietRuntime, SAMPLE_TEXT, silentLogger, timeSkippingEnv } from './helpers';
import { diffBlocks, filesWithTypeErrors, GUIDE, SECOND_EXAMPLE } from './guide';
import { cleanupAfterAll, copyRepository, scratchDir } from './scratch';

installQuietRuntime();
const defer = cleanupAfterAll();
const ROOT = path.join(__dirname, '..');
/** The files adding a step may touch: its own folder, its line in the step list, and its call in the workflow. */
const EXPECTED_FILES = [
  'activities/headline/index.ts',
  'activities/headline/offline.ts',
  'activities/index.ts',
  'workflows/index.ts',
];
/** The tests that write out a whole run's result by hand: a new step's result is missing from them (the guide says so). */
const WHOLE_RESULT_TESTS = ['test/outcomes.ts', 'test/statuses.test.ts'];

/** The files a patch writes (its `+++ b/<path>` lines). */
function filesOf(patch: string): string[] {
  return [...patch.matchAll(/^\+\+\+ b\/(\S+)$/gm)].map((m) => m[1] ?? '');
}

/** Every file under `dir` (relative paths), node_modules left out. */
function listFiles(dir: string, under = ''): string[] {
  return fs.readdirSync(path.join(dir, under), { withFileTypes: true }).flatMap((entry) => {
    const relative = path.join(under, entry.name);
    if (entry.name === 'node_modules') return [];
    return entry.isDirectory() ? listFiles(dir, relative) : [relative];
  });
}

describe('adding a step, as docs/add-a-step.md says', () => {
  let testEnv: TestWorkflowEnvironment;
  let copy: string;
  let patches: string[];
  let bundle: WorkflowBundleWithSourceMap;

  before(async () => {
    testEnv = await timeSkippingEnv(defer);
    copy = scratchDir(defer, 'add-a-step-');
    copyRepository(copy);
    // The first worked example's blocks: those before the second worked example.
    const guide = fs.readFileSync(GUIDE, 'utf8');
    patches = diffBlocks(guide.slice(0, guide.indexOf(SECOND_EXAMPLE)));
    for (const patch of patches) execFileSync('git', ['apply', '-'], { cwd: copy, input: patch });
    bundle = await bundleWorkflowCode({
      workflowsPath: path.join(copy, 'workflows'),
      logger: silentLogger,
    });
  });

  it('touches its own folder, the step list and the workflow, and nothing else', () => {
    assert.equal(patches.length, EXPECTED_FILES.length, 'the guide should have one patch per file');
    assert.deepEqual(patches.flatMap(filesOf).sort(), EXPECTED_FILES);
    const changed = listFiles(copy)
      .filter((file) => {
        const original = path.join(ROOT, file);
        return (
          !fs.existsSync(original) ||
          !fs.readFileSync(original).equals(fs.readFileSync(path.join(copy, file)))
        );
      })
      .sort();
    assert.deepEqual(changed, EXPECTED_FILES);
  });

  it('shows in the README the same code the patches add', () => {
    const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    const section = readme.slice(readme.indexOf('## Change a step'), readme.indexOf('## Layout'));
    const shown = [...section.matchAll(/^\s*```ts\n([\s\S]*?)^\s*```$/gm)].flatMap((m) =>
      (m[1] ?? '').split('\n').map((line) => line.trim()),
    );
    assert.ok(shown.length > 10, 'the README shows no code for the worked example');
    const added = new Set(
      patches
        .flatMap((p) => p.split('\n').filter((l) => l.startsWith('+') && !l.startsWith('+++')))
        .map((l) => l.slice(1).trim()),
    );
    assert.deepEqual(
      shown.filter((line) => line !== '' && !added.has(line)),
      [],
      'README lines the patches do not add',
    );
  });

  it(
    'type-checks with those changes alone, but for the tests that write out a whole result',
    { timeout: 120_000 },
    () => {
      const failing = filesWithTypeErrors(copy);
      assert.deepEqual(
        failing.filter((file) => !WHOLE_RESULT_TESTS.includes(file)),
        [],
        'files that no longer type-check once the step is added',
      );
    },
  );

  for (const model of ['the offline model', "the demo's model server"] as const) {
    it(
      `runs four steps on ${model}; the unchanged report, result table and publication count the new one`,
      { timeout: 90_000 },
      async () => {
        // The copy's composition root hands the copy's step list to the copy's kit.
        await import(path.join(copy, 'src', 'cli', 'compose.ts'));
        const { loadConfig } = await import(path.join(copy, 'src', 'config.ts'));
        const { createDependencies } = await import(path.join(copy, 'src', 'dependencies.ts'));
        const { createPipelineWorker } = await import(path.join(copy, 'src', 'temporal', 'worker.ts'));
        const { recoveryReport } = await import(path.join(copy, 'src', 'runs', 'history.ts'));
        const { printOutcomes } = await import(path.join(copy, 'src', 'runs', 'result-table.ts'));
        const { modelStepResults } = await import(path.join(copy, 'src', 'contract', 'index.ts'));
        const { stepNames } = await import(path.join(copy, 'src', 'steps', 'registry.ts'));
        const { headline: definition } = await import(path.join(copy, 'activities', 'headline', 'index.ts'));
        const { demoModel, startModelServer } = await import(path.join(copy, 'demo', 'model-server.ts'));
        const env: Record<string, string> = { DATA_DIR: path.join(copy, `data-${randomUUID()}`) };
        type Server = { baseUrl: string; requests: { step: string | undefined }[]; close(): Promise<void> };
        const server: Server | undefined =
          model === 'the offline model' ? undefined : await startModelServer(demoModel(0));
        if (server !== undefined) {
          defer(() => server.close());
          Object.assign(env, {
            MODEL: 'openai-compatible:demo',
            OPENAI_BASE_URL: server.baseUrl,
            MODEL_RPM: '10000',
            MODEL_TPM: '10000000',
          });
        }
        const parts = await createDependencies(loadConfig(env));
        defer(() => parts.close());
        const taskQueue = `add-a-step-${randomUUID()}`;
        const worker: Worker = await createPipelineWorker({
          connection: testEnv.nativeConnection,
          namespace: testEnv.namespace ?? 'default',
          taskQueue,
          deps: parts.deps,
          workflowBundle: bundle,
        });
        const documentId = `doc-${randomUUID()}`;
        const handle = await testEnv.client.workflow.start('documentPipeline', {
          taskQueue,
          workflowId: `wf-${randomUUID()}`,
          args: [
            {
              schemaVersion: 1,
              documentId,
              textRef: await parts.stores.blobs.put(Buffer.from(SAMPLE_TEXT, 'utf8')),
              title: 'Checkpoints',
            },
          ],
        });
        const result = await worker.runUntil(handle.result());
        const headline = { ...definition.fields.parse(result.headline), ...result.headline };
        assert.ok(headline.headline.length > 0);
        assert.equal(headline.idempotencyKey, `${handle.firstExecutionRunId}:headline`);
        assert.ok(headline.usage.outputTokens > 0, 'the headline step counts its tokens');
        const STEPS = stepNames();
        assert.deepEqual(STEPS, ['summarize', 'tag', 'headline', 'publish']);
        if (server !== undefined)
          assert.deepEqual(
            server.requests.map((r) => r.step).sort(),
            ['headline', 'summarize', 'tag'],
            "each step asked the demo's model server once, named in its request",
          );

        const report = recoveryReport(await handle.fetchHistory());
        assert.deepEqual(
          report.steps.map((s: { step: string; status: string }) => [s.step, s.status]),
          STEPS.map((step: string) => [step, 'completed']),
        );
        assert.equal(modelStepResults(result).length, 3, 'cost totals must count the headline step');
        const printed: string[] = [];
        printOutcomes(
          [
            {
              source: 'x.md',
              title: 'Checkpoints',
              workflowId: handle.workflowId,
              result,
              error: undefined,
              report,
            },
          ],
          (line: string) => printed.push(line),
          { columns: 200 },
        );
        assert.ok(
          printed.some((line) => line.includes('headline: ran once')),
          printed.join('\n'),
        );
        assert.ok(
          printed.some((line) => /\bHeadline\b/.test(line)) &&
            printed.some((line) => line.includes(headline.headline.slice(0, 20))),
          `the result table shows the headline column: ${printed.join('\n')}`,
        );
        const stored = await parts.stores.publications().currentPublication(documentId);
        assert.equal(stored?.fields.headline, headline.headline, 'the publication carries the headline');
      },
    );
  }

  it('still replays the histories recorded before the step existed (it is behind patched())', async () => {
    const dir = path.join(ROOT, 'test', 'histories');
    const histories = fs
      .readdirSync(dir)
      .filter((f) => f.endsWith('.json'))
      .map((f) => ({ workflowId: f, history: JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) }));
    assert.ok(histories.length > 0);
    for await (const replay of Worker.runReplayHistories({ workflowBundle: bundle }, histories)) {
      assert.equal(replay.error, undefined, `${replay.workflowId}: ${String(replay.error)}`);
    }
  });
});
