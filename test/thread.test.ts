/**
 * The offline model's thread (src/model/offline-model.ts) and the request thread under it (src/lib/thread.ts):
 * the thread answers what the main thread would, a thread that fails or dies fails only what it had, the next
 * request gets a new one, an aborted request ends at once, and an idle thread does not keep a process alive.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { RequestThread } from '../src/lib/thread';
import { OfflineModel } from '../src/model/offline-model';
import { score } from '../src/model/offline-nlp';
import { SAMPLES_DIR } from '../src/config';
import type { TestRequest } from './fixtures/test-thread';
import { summarizeRequest } from './requests';
import { tagRequest } from './requests';

const run = promisify(execFile);

describe('the offline model on its own thread', () => {
  it('answers as the same scoring on the main thread does', { timeout: 30_000 }, async () => {
    const model = new OfflineModel();
    for (const name of ['durable-execution', 'tidal-energy']) {
      const text = fs.readFileSync(path.join(SAMPLES_DIR, `${name}.md`), 'utf8');
      const [summary, tags] = await Promise.all([
        model.ask(summarizeRequest(3), text),
        model.ask(tagRequest(5), text),
      ]);
      const offline = (request: { offline: { module: string; exportName: string; input: unknown } }) =>
        score({ ...request.offline, text });
      assert.deepEqual(summary, offline(summarizeRequest(3)));
      assert.deepEqual(tags, offline(tagRequest(5)));
      assert.ok(summary.value.summary.length > 0 && tags.value.tags.length > 0, `${name}: an empty answer`);
    }
  });

  it('leaves the process free to end once its call is answered', { timeout: 60_000 }, async () => {
    const { stdout } = await run(
      process.execPath,
      ['--import', 'tsx', require.resolve('./fixtures/one-offline-call')],
      { timeout: 45_000 },
    );
    const tags: unknown = JSON.parse(stdout);
    assert.ok(Array.isArray(tags) && tags.length > 0, `no tags printed: ${stdout}`);
  });
});

describe('a request thread', () => {
  it(
    'whose module serves requests twice fails its first request, rather than answer each twice',
    { timeout: 30_000 },
    async () => {
      const twice = new RequestThread<object, string>(
        'the twice-serving thread',
        require.resolve('./fixtures/double-serving-thread'),
      );
      await assert.rejects(
        twice.call({}),
        /the twice-serving thread ended \(this thread answers requests already/,
      );
      await twice.close();
    },
  );

  const thread = new RequestThread<TestRequest, string>(
    'the test thread',
    require.resolve('./fixtures/test-thread'),
  );
  after(() => thread.close());

  it(
    "rejects a request whose handler threw, with the thread's name and the error, and goes on",
    { timeout: 30_000 },
    async () => {
      await assert.rejects(thread.call({ op: 'throw' }), /the test thread failed: the request asked for it/);
      assert.equal(await thread.call({ op: 'echo', text: 'still here' }), 'still here');
    },
  );

  it(
    'fails the requests a dying thread had, and starts a new one for the next',
    { timeout: 30_000 },
    async () => {
      const waiting = thread.call({ op: 'block', ms: 300 });
      const dying = thread.call({ op: 'exit' });
      assert.equal(await waiting, 'blocked');
      await assert.rejects(dying, /the test thread ended \(exit code 3\)/);
      assert.equal(await thread.call({ op: 'echo', text: 'a new thread' }), 'a new thread');
    },
  );

  it('rejects an aborted request at once, and answers the next', { timeout: 30_000 }, async () => {
    const controller = new AbortController();
    const started = performance.now();
    const blocked = thread.call({ op: 'block', ms: 5_000 }, controller.signal);
    setTimeout(() => controller.abort(new Error('the step was cancelled')), 50);
    await assert.rejects(blocked, /the step was cancelled/);
    assert.ok(performance.now() - started < 4_000, 'the abort waited for the thread');
    assert.equal(await thread.call({ op: 'echo', text: 'after the abort' }), 'after the abort');
    await assert.rejects(thread.call({ op: 'echo', text: 'too late' }, AbortSignal.abort()));
  });
});
