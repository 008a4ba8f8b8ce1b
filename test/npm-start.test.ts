/**
 * The promise of `npm start`, end to end as a person uses it: the main job on its embedded server, killed with
 * SIGKILL mid-run (and its embedded server with it, as in a machine crash), then started again on the same data
 * folder. The rerun resumes the open runs, finished steps are not repeated, and each document is published once.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { describe, it } from 'node:test';
import { recordedProcess } from '../src/temporal/pid-file';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import { dataPaths } from '../src/config';
import { completion, isTagRequest, modelServerFor } from './helpers';
import { cleanupAfterAll, freePort, scratchDir } from './scratch';

const ROOT = path.resolve(__dirname, '..');
const SAMPLE_COUNT = 4;

interface Run {
  output: () => string;
  exited: Promise<number | null>;
  kill: () => void;
}

function startMain(env: Record<string, string>): Run {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'src/cli/start.ts')], {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString('utf8')));
  child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
  return {
    output: () => output,
    exited: new Promise((resolve) => child.once('exit', (code) => resolve(code))),
    kill: () => child.kill('SIGKILL'),
  };
}

async function waitFor(what: string, check: () => boolean, timeoutMs: number, run: Run): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}; output so far:\n${run.output()}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe('npm start after a kill -9', () => {
  const defer = cleanupAfterAll();

  it('resumes on the same data folder without repeating finished steps', async () => {
    const dataDir = scratchDir(defer, 'npm-start-');
    // A slow model in this process: its request log is evidence the killed process cannot tidy up.
    // Summaries come back after 1.5 s, tags after 5 s: the kill lands after summarize and inside tag.
    const model = await modelServerFor(defer, (request) => ({
      delayMs: isTagRequest(request) ? 5_000 : 1_500,
      body: isTagRequest(request)
        ? completion('{"tags": ["resume"]}')
        : completion('A summary that took a while to write.'),
    }));
    const env: Record<string, string> = {
      PATH: process.env.PATH ?? '',
      HOME: process.env.HOME ?? '',
      DATA_DIR: dataDir,
      EMBEDDED_TEMPORAL_PORT: String(await freePort()),
      TEMPORAL_UI_PORT: String(await freePort()),
      OPENAI_BASE_URL: model.baseUrl,
      OPENAI_MODEL: 'test-model',
      // A limit known ahead (far above these 8 calls): with none, the pacing sends one call alone first to learn
      // the limits from its answer, so the summaries would not all be done, nor every tag under way, at the kill.
      MODEL_RPM: '6000',
      ...(process.env.TEMPORAL_CLI_PATH ? { TEMPORAL_CLI_PATH: process.env.TEMPORAL_CLI_PATH } : {}),
    };
    // The embedded server records its process ID in the data folder; kill it as a machine crash would.
    const killEmbeddedServer = (): void => {
      const server = recordedProcess(dataPaths(dataDir).temporalPid);
      assert.ok(server, 'no record of the embedded server in the data folder');
      process.kill(server.pid, 'SIGKILL');
    };

    const first = startMain(env);
    defer(first.kill);
    await waitFor('a finished summarize', () => /summarize ✓/.test(first.output()), 120_000, first);
    first.kill();
    killEmbeddedServer();
    await first.exited;
    const firstOutput = first.output();
    assert.match(firstOutput, /\(embedded\)/, 'the first run did not start the embedded server');
    const requestsBeforeKill = model.requests.length;

    const second = startMain(env);
    defer(second.kill);
    const code = await Promise.race([
      second.exited,
      new Promise<never>((_, reject) =>
        setTimeout(() => reject(new Error(`rerun did not finish:\n${second.output()}`)), 180_000).unref(),
      ),
    ]);
    const out = second.output();
    assert.equal(code, 0, out);
    assert.match(out, /\(embedded\)/);
    assert.match(
      out,
      new RegExp(`${SAMPLE_COUNT} of ${SAMPLE_COUNT} document\\(s\\) published, 0 failed`),
      out,
    );
    assert.doesNotMatch(out, /\(started\)/, 'the rerun started a new run instead of resuming');
    assert.match(out, /done earlier, skipped on resume/, 'no step was reported as skipped on resume');

    // Summarize had finished everywhere before the kill: skipped on resume, the model asked once per document.
    // Tag was cut off mid-call: rerun under the same key (the model sees that key again, nothing else).
    assert.equal([...out.matchAll(/summarize: done earlier, skipped on resume/g)].length, SAMPLE_COUNT, out);
    assert.equal([...out.matchAll(/tag: rerun/g)].length, SAMPLE_COUNT, out);
    const requestsPerKey = (step: string): number[] => {
      const counts = new Map<string, number>();
      for (const r of model.requests) {
        const key = r.idempotencyKey ?? '';
        if (key.endsWith(`:${step}`)) counts.set(key, (counts.get(key) ?? 0) + 1);
      }
      return [...counts.values()];
    };
    assert.deepEqual(
      requestsPerKey('summarize'),
      Array(SAMPLE_COUNT).fill(1),
      'a finished summarize ran again',
    );
    assert.deepEqual(
      requestsPerKey('tag'),
      Array(SAMPLE_COUNT).fill(2),
      'tag was not retried under its own key',
    );
    assert.equal(model.requests.length, SAMPLE_COUNT * 3);

    const store = new SqlitePublicationStore(path.join(dataDir, 'publications.db'));
    defer(() => store.close());
    assert.equal(await store.countPublications(), SAMPLE_COUNT);
    const created = (await store.deliveries()).filter((d) => d.outcome === 'created');
    assert.equal(created.length, SAMPLE_COUNT, 'a document was published twice');
    console.log(
      `npm start resume: ${requestsBeforeKill} model requests before the kill, ${model.requests.length} in all; ` +
        `summarize skipped on resume x${SAMPLE_COUNT}, tag rerun x${SAMPLE_COUNT}; ${created.length} publications`,
    );
  });
});
