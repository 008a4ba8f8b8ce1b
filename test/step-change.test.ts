/**
 * A step knows when it changed. On a copy of the repository, through its own commands (`npm run worker`,
 * `npm run pipeline -- --rerun`, `npm run report`) against a real dev server and the demo's model server: the
 * documents run once; then tag's instructions are edited, and a rerun asks tag again for every document and
 * summarize for none (the model server's log), says so in the result table and the report, and counts the
 * publications that differ; then the edit is reverted, and a rerun asks nothing at all: the first answers are
 * still in the memo, under the first identity.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { startWorkerProcess } from '../demo/worker-process';
import { workflowIdFor } from '../src/contract';
import { documentIdOf } from '../src/documents/files';
import type { WorkerProcess } from '../demo/worker-process';
import {
  completion,
  CRASH_WORKER_DEFAULTS,
  devServerEnv,
  installQuietRuntime,
  isTagRequest,
  modelServerFor,
  SUMMARY,
  TAGS,
} from './helpers';
import type { ChatRequest, ModelServer } from './helpers';
import { cleanupAfterAll, copyRepository, scratchDir } from './scratch';

installQuietRuntime();
const defer = cleanupAfterAll();
const run = promisify(execFile);

/** The edit: tag's instructions say the same in other words (its identity changes, nothing else). */
const ORIGINAL = 'Give at most ${maxTags} topic tags for the document above';
const EDITED = 'Name at most ${maxTags} topic tags for the document above';

/** The model's answers: tags that tell which instructions asked for them. */
function answer(request: ChatRequest) {
  if (!isTagRequest(request)) return { body: completion(SUMMARY) };
  const edited = JSON.stringify(request.body).includes('Name at most');
  return { body: completion(edited ? '{"tags": ["renamed"]}' : TAGS) };
}

describe('a step that changed is asked again, and only it', { timeout: 8 * 60_000 }, () => {
  let env: TestWorkflowEnvironment;
  let server: ModelServer;
  let copy: string;
  let childEnv: NodeJS.ProcessEnv;
  let worker: WorkerProcess | undefined;
  const tagFile = (): string => path.join(copy, 'activities', 'tag', 'index.ts');

  before(async () => {
    env = await devServerEnv();
    defer(() => env.teardown());
    server = await modelServerFor(defer, answer);
    copy = scratchDir(defer, 'step-change-');
    copyRepository(copy);
    assert.ok(
      fs.readFileSync(tagFile(), 'utf8').includes(ORIGINAL),
      "tag's instructions moved: update this test",
    );
    childEnv = {
      ...process.env,
      ...CRASH_WORKER_DEFAULTS,
      TEMPORAL_ADDRESS: env.connection.options.address,
      TEMPORAL_TASK_QUEUE: `step-change-${randomUUID()}`,
      DATA_DIR: path.join(copy, 'data'),
      MODEL: 'openai-compatible:demo-model',
      OPENAI_BASE_URL: server.baseUrl,
      OPENAI_API_KEY: 'test-key',
      METRICS_PORT: '',
    };
  });
  after(async () => {
    await worker?.kill();
  });

  /** A worker of the copy as it is now (a worker loads the step list when it starts), then the documents. */
  const rerun = async (): Promise<{ output: string; asked: ChatRequest[] }> => {
    await worker?.kill();
    worker = await startWorkerProcess(childEnv, { script: path.join(copy, 'src', 'cli', 'worker.ts') });
    const seen = server.requests.length;
    const { stdout } = await run(
      process.execPath,
      ['--import', 'tsx', 'src/cli/pipeline.ts', '--rerun', 'samples/'],
      { cwd: copy, env: childEnv, timeout: 180_000 },
    );
    return { output: stdout, asked: server.requests.slice(seen) };
  };
  const stepsOf = (requests: readonly ChatRequest[]): Record<string, number> => {
    const counts: Record<string, number> = {};
    for (const request of requests) counts[request.step ?? '?'] = (counts[request.step ?? '?'] ?? 0) + 1;
    return counts;
  };
  const documents = (): number =>
    fs.readdirSync(path.join(copy, 'samples')).filter((f) => f.endsWith('.md')).length;

  it('asks every step for every document on the first run', async (t) => {
    const { output, asked } = await rerun();
    t.diagnostic(`first run: model calls ${JSON.stringify(stepsOf(asked))}`);
    assert.deepEqual(stepsOf(asked), { summarize: documents(), tag: documents() }, output);
    assert.doesNotMatch(output, /Asked again because the step changed/);
  });

  it("asks tag again after its prompt changed, reuses summarize's answers, and says so", async (t) => {
    fs.writeFileSync(tagFile(), fs.readFileSync(tagFile(), 'utf8').replace(ORIGINAL, EDITED));
    const { output, asked } = await rerun();
    t.diagnostic(`after the edit: model calls ${JSON.stringify(stepsOf(asked))}`);
    t.diagnostic(output.split('\n').find((line) => line.startsWith('Asked again')) ?? '(no line)');
    assert.deepEqual(stepsOf(asked), { tag: documents() }, output);
    assert.match(
      output,
      new RegExp(
        `Asked again because the step changed: tag for ${documents()} document\\(s\\);.*` +
          `${documents()} of ${documents()} publication\\(s\\) differ from their previous revision`,
      ),
    );
    const first = fs.readdirSync(path.join(copy, 'samples')).filter((f) => f.endsWith('.md'))[0] ?? '';
    const workflowId = workflowIdFor(documentIdOf(path.join(copy, 'samples', first), copy));
    const { stdout: report } = await run(
      process.execPath,
      ['--import', 'tsx', 'src/cli/report.ts', workflowId],
      {
        cwd: copy,
        env: childEnv,
        timeout: 60_000,
      },
    );
    assert.match(report, /^tag: .*\n(?:.*\n)*? {2}identity: +\w+ \(asked again: the step changed since/m);
    assert.match(report, /^summarize: completed; reused from the memo/m);
    assert.match(report, /publication: +differs from the previous revision/);
  });

  it('asks nothing once the change is reverted: the first answers are still in the memo', async (t) => {
    fs.writeFileSync(tagFile(), fs.readFileSync(tagFile(), 'utf8').replace(EDITED, ORIGINAL));
    const { output, asked } = await rerun();
    t.diagnostic(`after the revert: model calls ${JSON.stringify(stepsOf(asked))}`);
    assert.deepEqual(stepsOf(asked), {}, output);
    assert.doesNotMatch(output, /Asked again because the step changed/);
  });
});
