/**
 * Production failing around the worker, black box: `npm run worker` processes and `npm run pipeline` on a dev
 * server and the local PostgreSQL, with the evidence counted outside them, at the model server and the receiver.
 * Each scenario has its own task queue, database, model server and receiver, and faults of one kind:
 *
 * - control: no fault;
 * - the database: connections refused for seconds, three times, and every backend terminated, while model calls
 *   and publishes are under way (through a TCP link in front of the real PostgreSQL);
 * - a gateway that lets the POST through to an origin that applies it, and answers 502 or 504;
 * - a receiver that redirects;
 * - a receiver that dedupes silently (no echo), with a SIGKILL of the worker right after a POST took effect;
 * - a worker cut off from the Temporal server (not from the model or the database) past the heartbeat timeout,
 *   in a network namespace of the test's own, while another worker takes its steps over;
 * - a rolling deploy: SIGTERM to the whole process group of `npm run worker`, twice, with model calls in flight.
 *
 * Each asserts: no worker crashed, no model answer paid twice, no duplicate effect, no document lost, and none
 * held without being shown. The figures go to the log (`infra-faults (<scenario>): ...`).
 */
import '../src/cli/compose';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { startWorkerProcess } from '../demo/worker-process';
import type { WorkerProcess } from '../demo/worker-process';
import { completion, startModelServer } from '../demo/model-server';
import type { ModelServer } from '../demo/model-server';
import { workflowIdFor } from '../src/contract';
import { documentIdOf } from '../src/documents/files';
import { recoveryReport } from '../src/runs/history';
import { closeServer, listenOnLoopback, readBody } from '../src/lib/loopback';
import { answerLookup, devServerEnv, SAMPLE_TEXT } from './helpers';
import { networkNamespace } from './netns';
import { freshDatabase, onDatabase, TEST_DATABASE_URL } from './postgres';
import { cleanupAfterAll, scratchDir } from './scratch';
import { tcpLink } from './tcp-link';

const ROOT = path.resolve(__dirname, '..');
const defer = cleanupAfterAll();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

interface Effect {
  key: string;
  documentId: string;
  /** The document version the publication carried. */
  textRef: string;
}

interface ReceiverOptions {
  /** Answers a key it has seen as a duplicate instead of applying it again. */
  dedupes: boolean;
  /** Echoes Idempotency-Key in its answer (shows that it dedupes). */
  echoes: boolean;
  /** Serves `GET /publications/<key>` (200 or 404, naming the key), for PUBLISH_WEBHOOK_LOOKUP_URL. */
  lookup: boolean;
  /** The status a gateway in front answers for POST n (from 1), the origin having applied it; else 201. */
  gateway?: (n: number) => number | undefined;
  /** Answers every POST with a 307 to this URL, applying nothing. */
  redirectTo?: string;
}

/** A webhook receiver that keeps its own log of effects: the evidence. `afterEffect` runs before it answers. */
async function testReceiver(options: ReceiverOptions) {
  const effects: Effect[] = [];
  let posts = 0;
  const state = { afterEffect: undefined as ((effect: Effect) => void) | undefined };
  const server = http.createServer((req, res) => {
    void (async () => {
      const lookup = /^\/publications\/(.+)$/.exec(req.url ?? '');
      if (req.method === 'GET' && lookup?.[1] !== undefined && options.lookup) {
        const key = decodeURIComponent(lookup[1]);
        const found = effects.find((e) => e.key === key);
        answerLookup(res, key, found && { revision: 1, textRef: found.textRef });
        return;
      }
      const body = JSON.parse((await readBody(req)).toString('utf8')) as {
        documentId: string;
        textRef: string;
      };
      posts += 1;
      const key = String(req.headers['idempotency-key']);
      if (options.redirectTo !== undefined) {
        res.writeHead(307, { location: options.redirectTo }).end();
        return;
      }
      const seen = effects.some((e) => e.key === key);
      if (!(options.dedupes && seen)) {
        const effect = { key, documentId: body.documentId, textRef: body.textRef };
        effects.push(effect);
        state.afterEffect?.(effect);
      }
      const status = options.gateway?.(posts) ?? (options.dedupes && seen ? 200 : 201);
      res
        .writeHead(status, {
          'content-type': 'application/json',
          ...(options.echoes ? { 'idempotency-key': key } : {}),
        })
        .end(JSON.stringify({ revision: 1, duplicate: options.dedupes && seen }));
    })().catch(() => res.destroy());
  });
  const origin = await listenOnLoopback(server, 'receiver');
  defer(() => closeServer(server));
  return { url: `${origin}/publications`, origin, effects, posts: () => posts, state };
}

/** A folder of `count` documents of its own. */
function documents(count: number): { dir: string; ids: string[] } {
  const dir = scratchDir(defer, 'infra-docs-');
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const file = path.join(dir, `doc-${i}.md`);
    fs.writeFileSync(file, `# Fault ${i} ${randomUUID()}\n\n${SAMPLE_TEXT}\n`);
    ids.push(documentIdOf(file));
  }
  return { dir, ids };
}

/** Runs `npm run pipeline -- <dir>` (the client only) to its end, with a deadline. */
function runPipeline(dir: string, envVars: Record<string, string>, deadlineMs = 150_000) {
  const child = spawn('npm', ['run', '--silent', 'pipeline', '--', dir], {
    cwd: ROOT,
    env: { ...process.env, ...envVars },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString('utf8')));
  child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
  const timer = setTimeout(() => process.kill(-(child.pid ?? 0), 'SIGKILL'), deadlineMs);
  defer(() => {
    if (child.exitCode === null && child.signalCode === null) process.kill(-(child.pid ?? 0), 'SIGKILL');
  });
  return new Promise<{ code: number | string; output: string }>((resolve) =>
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code: signal ?? code ?? -1, output });
    }),
  );
}

/** Runs `npm run <args>` to its end with these settings. */
function npmRun(
  args: string[],
  envVars: Record<string, string>,
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const child = spawn('npm', ['run', '--silent', ...args], {
      cwd: ROOT,
      env: { ...process.env, ...envVars },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (c: Buffer) => (output += c.toString('utf8')));
    child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
    child.once('exit', (code) => resolve({ code, output }));
  });
}

/** The keys of the deliveries the ledger holds open. */
async function openClaims(databaseUrl: string): Promise<string[]> {
  const keys: string[] = [];
  await onDatabase(databaseUrl, async (client) => {
    const result = await client.query<{ idempotency_key: string }>(
      "SELECT idempotency_key FROM delivery_ledger WHERE state = 'claimed'",
    );
    keys.push(...result.rows.map((r) => r.idempotency_key));
  });
  return keys;
}

/** Keys the model answered more than once: each is a paid answer paid again. */
function paidTwice(model: ModelServer): string[] {
  const answered = new Map<string, number>();
  for (const r of model.requests)
    if (r.answeredAt !== undefined)
      answered.set(r.idempotencyKey ?? '?', (answered.get(r.idempotencyKey ?? '?') ?? 0) + 1);
  return [...answered].filter(([, n]) => n > 1).map(([key, n]) => `${key} x${n}`);
}

/** Documents with other than one effect at the receiver. */
function notOnce(ids: readonly string[], effects: readonly Effect[]): string[] {
  return ids.flatMap((id) => {
    const n = effects.filter((e) => e.documentId === id).length;
    return n === 1 ? [] : [`${id}: ${n} effects`];
  });
}

/** Waits until `ready()` holds, every 50 ms, up to `ms`. */
async function until(ready: () => boolean, what: string, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!ready()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/**
 * One scenario's parts: a database, a slow model server, a receiver, a task queue and the worker settings.
 * `modelDelayMs` is how long the model takes to answer, or a function of the request's number (from 1).
 */
async function scenario(
  receiverOptions: ReceiverOptions,
  { modelDelayMs = 1_500 as number | ((n: number) => number) } = {},
) {
  const databaseUrl = await freshDatabase(defer);
  const model = await startModelServer((request, n) => ({
    body: completion(
      request.step === 'tag' ? '{"tags": ["faults"]}' : `A summary for ${request.idempotencyKey}.`,
    ),
    delayMs: typeof modelDelayMs === 'number' ? modelDelayMs : modelDelayMs(n),
  }));
  defer(() => model.close());
  const receiver = await testReceiver(receiverOptions);
  const taskQueue = `infra-${randomUUID()}`;
  const workers: WorkerProcess[] = [];
  const settings = (over: Record<string, string> = {}): Record<string, string> => ({
    TEMPORAL_ADDRESS: env.address,
    TEMPORAL_NAMESPACE: env.namespace ?? 'default',
    TEMPORAL_TASK_QUEUE: taskQueue,
    DATA_DIR: scratchDir(defer, 'infra-data-'),
    DATABASE_URL: databaseUrl,
    OPENAI_BASE_URL: model.baseUrl,
    OPENAI_MODEL: 'fault-model',
    MODEL: '',
    OPENAI_API_KEY: '',
    PUBLISH_WEBHOOK_URL: receiver.url,
    PUBLISH_REQUEST_TIMEOUT_MS: '3000',
    LOG_LEVEL: 'info',
    ...over,
  });
  const startWorker = async (
    over: Record<string, string> = {},
    wrapper: string[] = [],
  ): Promise<WorkerProcess> => {
    const worker = await startWorkerProcess({ ...process.env, ...settings(over) }, { viaNpm: true, wrapper });
    workers.push(worker);
    defer(async () => void (await worker.kill()));
    return worker;
  };
  /** Workers that ended without being told to: crashes. */
  const crashed = (): string[] =>
    workers.filter((w) => w.child.exitCode !== null || w.child.signalCode !== null).map((w) => w.identity);
  return { databaseUrl, model, receiver, taskQueue, settings, startWorker, workers, crashed };
}

const log = (name: string, line: string): void => console.log(`infra-faults (${name}): ${line}`);

describe('production failing around the worker', { concurrency: 3 }, () => {
  it(
    'control: no fault, each answer paid once, each document published once',
    { timeout: 240_000 },
    async () => {
      const s = await scenario({ dedupes: true, echoes: true, lookup: false });
      const { dir, ids } = documents(4);
      await s.startWorker();
      const run = await runPipeline(dir, s.settings());
      assert.equal(run.code, 0, run.output);
      assert.deepEqual(paidTwice(s.model), []);
      assert.deepEqual(notOnce(ids, s.receiver.effects), []);
      assert.deepEqual(s.crashed(), []);
      log(
        'control',
        `${ids.length} documents, ${s.model.requests.length} model calls, ${s.receiver.effects.length} effects`,
      );
    },
  );

  it(
    'the database: refused for seconds three times and every backend terminated, mid-call and mid-publish',
    { timeout: 240_000 },
    async () => {
      // Calls that take longer the later they come (1.5 s, 2.5 s, ... 10.5 s for ten): a worker that starts all ten
      // at once still has some open for each of the three refusals, and answers land during each of them.
      const s = await scenario(
        { dedupes: true, echoes: true, lookup: false },
        { modelDelayMs: (n) => 500 + 1_000 * Math.min(n, 10) },
      );
      const target = new URL(s.databaseUrl);
      const link = await tcpLink(defer, `${target.hostname}:${target.port || '5432'}`);
      const linked = new URL(s.databaseUrl);
      linked.host = link.address;
      const { dir, ids } = documents(5);
      await s.startWorker({ DATABASE_URL: linked.toString() });
      const running = runPipeline(dir, s.settings());
      const faults: string[] = [];
      for (let i = 0; i < 3; i++) {
        await until(() => s.model.open().length > 0, 'a model call in flight');
        const open = s.model.open().length;
        await link.refuseFor(2_500);
        faults.push(`refused 2.5 s with ${open} model call(s) open`);
      }
      await until(() => s.receiver.effects.length > 0, 'a publish');
      await onDatabase(TEST_DATABASE_URL, (client) =>
        client.query(
          'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
          [target.pathname.slice(1)],
        ),
      );
      faults.push('every backend terminated after a publish');
      const run = await running;
      assert.equal(run.code, 0, run.output);
      assert.deepEqual(s.crashed(), [], 'a worker died of a database fault');
      assert.deepEqual(paidTwice(s.model), []);
      assert.deepEqual(notOnce(ids, s.receiver.effects), []);
      log(
        'database',
        `${faults.join('; ')}; ${s.model.requests.length} model calls, ${s.receiver.effects.length} effects for ${ids.length} documents`,
      );
    },
  );

  for (const status of [502, 504]) {
    it(
      `a gateway that answers ${status} after the origin applied the POST: the lookup settles it, one effect`,
      { timeout: 240_000 },
      async () => {
        const s = await scenario({
          dedupes: false,
          echoes: false,
          lookup: true,
          gateway: (n) => (n <= 2 ? status : undefined),
        });
        const { dir, ids } = documents(3);
        await s.startWorker({ PUBLISH_WEBHOOK_LOOKUP_URL: `${s.receiver.url}/{key}` });
        const run = await runPipeline(dir, s.settings());
        assert.equal(run.code, 0, run.output);
        assert.deepEqual(
          notOnce(ids, s.receiver.effects),
          [],
          'a POST the gateway answered with an error was sent again',
        );
        assert.deepEqual(paidTwice(s.model), []);
        assert.deepEqual(s.crashed(), []);
        log(
          `gateway ${status}`,
          `${s.receiver.posts()} POSTs, ${s.receiver.effects.length} effects for ${ids.length} documents`,
        );
      },
    );
  }

  it(
    'a receiver that redirects: nothing is sent to the Location, each document fails naming it',
    { timeout: 240_000 },
    async () => {
      let elsewhere = 0;
      const other = http.createServer((req, res) => {
        elsewhere += 1;
        req.resume();
        res.writeHead(201).end('{}');
      });
      const otherOrigin = await listenOnLoopback(other, 'redirect target');
      defer(() => closeServer(other));
      const s = await scenario({
        dedupes: true,
        echoes: true,
        lookup: false,
        redirectTo: `${otherOrigin}/elsewhere`,
      });
      const { dir, ids } = documents(2);
      await s.startWorker();
      const run = await runPipeline(dir, s.settings());
      assert.equal(run.code, 1, run.output);
      const named = new Set(
        [
          ...run.output.matchAll(/^FAILED (\S+): .*redirecting to http:\/\/127\.0\.0\.1:\d+\/elsewhere;/gm),
        ].map((m) => m[1]),
      );
      assert.equal(named.size, ids.length, run.output);
      assert.equal(elsewhere, 0, 'the POST (or a GET) went to the Location');
      assert.deepEqual(paidTwice(s.model), []);
      assert.deepEqual(s.crashed(), []);
      log(
        'redirect',
        `${s.receiver.posts()} POSTs, 0 followed, ${ids.length} documents failed naming the Location`,
      );
    },
  );

  it(
    'a receiver that dedupes silently, a SIGKILL right after a POST: held, shown, settled by the operator, one effect',
    { timeout: 240_000 },
    async () => {
      const s = await scenario({ dedupes: true, echoes: false, lookup: false });
      const { dir, ids } = documents(3);
      let first = await s.startWorker();
      s.receiver.state.afterEffect = () => {
        s.receiver.state.afterEffect = undefined;
        process.kill(-(first.child.pid ?? 0), 'SIGKILL');
      };
      const running = runPipeline(dir, s.settings());
      await until(() => s.receiver.effects.length > 0, 'a POST');
      await first.exited;
      s.workers.splice(s.workers.indexOf(first), 1); // killed on purpose, not a crash
      first = await s.startWorker();
      const run = await running;
      assert.equal(run.code, 4, run.output);
      const held = [
        ...run.output.matchAll(/^HELD (\S+): npm run deliveries -- resolve (\S+) delivered/gm),
      ].map((m) => m[2] ?? '');
      assert.ok(held.length >= 1, run.output);
      // The held keys are exactly the open claims: none held without being shown.
      const open = await openClaims(s.databaseUrl);
      assert.deepEqual([...held].sort(), [...open].sort(), run.output);
      // The operator checks the receiver's own log for each, then settles it the documented way: delivered when
      // the receiver has it, unsent when it does not (once the claim's POST cannot be under way any more).
      const verdicts: string[] = [];
      for (const key of held) {
        const landed = s.receiver.effects.some((e) => e.key === key);
        const args = landed ? ['delivered', '--revision', '1'] : ['unsent'];
        const deadline = Date.now() + 60_000;
        for (;;) {
          const settle = await npmRun(['deliveries', '--', 'resolve', key, ...args], s.settings());
          if (settle.code === 0) break;
          assert.ok(Date.now() < deadline && /may still be under way/.test(settle.output), settle.output);
          await sleep(1_000);
        }
        verdicts.push(landed ? 'delivered' : 'unsent');
      }
      for (const id of ids) await env.client.workflow.getHandle(workflowIdFor(id)).result();
      assert.deepEqual(await openClaims(s.databaseUrl), []);
      assert.deepEqual(notOnce(ids, s.receiver.effects), []);
      assert.deepEqual(s.crashed(), []);
      log(
        'silent dedupe',
        `1 SIGKILL after a POST; ${held.length} delivery(ies) held, each shown with its command (exit 4), settled ` +
          `(${verdicts.join(', ')}); ${s.receiver.effects.length} effects for ${ids.length} documents`,
      );
    },
  );

  it(
    'a worker cut off from Temporal past the heartbeat timeout, not from the model or the database: another takes over, nothing paid twice',
    { timeout: 240_000 },
    async () => {
      const s = await scenario({ dedupes: true, echoes: true, lookup: false }, { modelDelayMs: 4_000 });
      const ns = networkNamespace(defer);
      // The namespace reaches every server through a link on its side of the veth pair; only Temporal's is cut.
      const via = async (address: string) => (await tcpLink(defer, address, ns.hostAddress)).address;
      const temporal = await tcpLink(defer, env.address, ns.hostAddress);
      const database = new URL(s.databaseUrl);
      database.host = await via(`${database.hostname}:${database.port || '5432'}`);
      const modelUrl = new URL(s.model.baseUrl);
      const receiverUrl = new URL(s.receiver.url);
      modelUrl.host = await via(new URL(s.model.baseUrl).host);
      receiverUrl.host = await via(receiverUrl.host);
      const { dir, ids } = documents(3);
      const cutOff = await s.startWorker(
        {
          TEMPORAL_ADDRESS: temporal.address,
          DATABASE_URL: database.toString(),
          OPENAI_BASE_URL: modelUrl.toString().replace(/\/$/, ''),
          PUBLISH_WEBHOOK_URL: receiverUrl.toString(),
        },
        ns.exec,
      );
      const running = runPipeline(dir, s.settings());
      await until(() => s.model.open().length >= 2, 'model calls in flight on the worker in the namespace');
      temporal.partition(true);
      const since = Date.now();
      const takeover = await s.startWorker();
      // Past the heartbeat timeout (10 s) and the first retry's wait: the server hands the steps to the other worker.
      await sleep(15_000);
      const cutFor = Date.now() - since;
      temporal.partition(false);
      const run = await running;
      assert.equal(run.code, 0, run.output);
      // The steps were taken over (a later attempt, on the other worker), and the calls were still paid once.
      const reports = await Promise.all(
        ids.map(async (id) =>
          recoveryReport(await env.client.workflow.getHandle(workflowIdFor(id)).fetchHistory()),
        ),
      );
      const takenOver = reports
        .flatMap((r) => r.steps)
        .filter((step) => step.attempts > 1 && step.worker === takeover.identity);
      assert.ok(takenOver.length > 0, `no step was handed to the other worker: ${JSON.stringify(reports)}`);
      assert.deepEqual(paidTwice(s.model), []);
      assert.deepEqual(notOnce(ids, s.receiver.effects), []);
      assert.deepEqual(s.crashed(), [], `${cutOff.output()}`);
      log(
        'partition',
        `worker cut off from Temporal for ${(cutFor / 1000).toFixed(0)} s with calls in flight; ${takenOver.length} ` +
          `step(s) taken over by the other worker; ${s.model.requests.length} model calls, ` +
          `${s.receiver.effects.length} effects for ${ids.length} documents`,
      );
    },
  );

  it(
    'a rolling deploy: SIGTERM to the process group of npm run worker, twice, with model calls in flight',
    { timeout: 240_000 },
    async () => {
      const s = await scenario({ dedupes: true, echoes: true, lookup: false }, { modelDelayMs: 3_000 });
      const { dir, ids } = documents(4);
      const old = await s.startWorker();
      const running = runPipeline(dir, s.settings());
      await until(() => s.model.open().length >= 2, 'model calls in flight');
      const inFlight = s.model.open().length;
      process.kill(-(old.child.pid ?? 0), 'SIGTERM');
      await sleep(500);
      signalGroup(-(old.child.pid ?? 0), 'SIGTERM'); // npm is gone by now (it ends at once), the worker is not
      await s.startWorker();
      await old.exited;
      s.workers.splice(s.workers.indexOf(old), 1); // stopped on purpose
      assert.match(old.output(), /stopped: the steps it finished are recorded/, old.output());
      const run = await running;
      assert.equal(run.code, 0, run.output);
      assert.equal(s.model.requests.filter((r) => r.cutOff).length, 0, 'a model call was cut by the deploy');
      assert.deepEqual(paidTwice(s.model), []);
      assert.deepEqual(notOnce(ids, s.receiver.effects), []);
      log(
        'rolling deploy',
        `2 SIGTERMs to the group with ${inFlight} calls in flight; 0 cut; ${s.model.requests.length} model calls, ${s.receiver.effects.length} effects for ${ids.length} documents`,
      );
    },
  );
});

/** Signals a process group, if any of it is left. */
function signalGroup(group: number, signal: NodeJS.Signals): void {
  try {
    process.kill(group, signal);
  } catch {
    // The whole group has ended.
  }
}
