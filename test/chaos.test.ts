/**
 * Chaos: real SIGKILLs of real worker processes, and restarts of the Temporal dev server itself, in the middle of a
 * batch. The worker calls a slow OpenAI-compatible model server and publishes to a webhook receiver, both real HTTP
 * servers in this process, so the evidence that no finished step ran twice and no document was published twice is
 * collected outside the worker that is being killed: every request and delivery, with its idempotency key.
 *
 * The moments are drawn from a seeded PRNG; the seed is printed first. CHAOS_SEED=<seed> replays the same kill plan
 * and delays (the exact interleaving still depends on timing); CHAOS_DEBUG=1 also logs every request with a time.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { randomInt, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { SAMPLES_DIR } from '../src/config';
import { BlobStore } from '../src/documents/blobs';
import { submitDocument } from '../src/runs/submit';
import { dataPaths } from '../src/config';
import { collectDocuments, documentIdFor, titleOf } from '../src/documents/files';
import type { DocumentFile } from '../src/documents/files';
import { AnswerMemo } from '../src/model/memo';
import { PublicationStore } from '../src/publisher/publication-store';
import type { Publication, Receipt } from '../src/publisher/types';
import { startReceiver } from '../src/publisher/receiver';
import type { Receiver } from '../src/publisher/receiver';
import { recoveryReport } from '../src/runs/history';
import { workflowIdFor } from '../src/contract';
import type { PipelineResult, StepName } from '../src/contract';

import type { WorkerProcess } from '../src/cli/demo/worker-process';
import { startModelServer } from '../src/cli/demo/model-server';
import type { ChatRequest, ModelServer } from '../src/cli/demo/model-server';
import {
  completion,
  freePort,
  startCrashableWorker,
  temporalExecutable,
  tempDir,
  writeWorkflowBundle,
} from './helpers';

const SEED = process.env.CHAOS_SEED ? Number(process.env.CHAOS_SEED) : randomInt(2 ** 31);
if (!Number.isSafeInteger(SEED))
  throw new Error(`CHAOS_SEED must be a whole number, not "${process.env.CHAOS_SEED}"`);
/** Kills in one run, by moment; the plan is shuffled with the seed. */
const KILL_KINDS = [
  ...Array<KillKind>(4).fill('model call'),
  ...Array<KillKind>(3).fill('after publish'),
  ...Array<KillKind>(3).fill('between steps'),
  ...Array<KillKind>(2).fill('random moment'),
];
const SERVER_RESTARTS = 2;
/** How long to wait for a moment of the planned kind before killing at whatever moment it is. */
const WAIT_FOR_MOMENT_MS = 20_000;
/** Documents kept in flight while the kill plan runs; the four samples go first, then generated notes. */
const IN_FLIGHT = 4;
/** A new document at most this often, so fresh model calls and publications keep coming for every kill. */
const SUBMIT_EVERY_MS = 1_500;
/** Model steps allow 6 attempts: a kill is held back while an open call already is on its 4th. */
const MAX_ATTEMPT_TO_KILL = 3;
/** Two processes' clocks on one machine: a request this long after the recorded completion would be a rerun. */
const CLOCK_TOLERANCE_MS = 500;

type KillKind = 'model call' | 'after publish' | 'between steps' | 'random moment';

/** mulberry32: a tiny seeded PRNG, good enough to make a chaos run replayable. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const random = mulberry32(SEED);
const between = (min: number, max: number): number => Math.round(min + random() * (max - min));
function shuffled<T>(items: readonly T[]): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    const [x, y] = [out[i], out[j]];
    if (x === undefined || y === undefined) continue;
    [out[i], out[j]] = [y, x];
  }
  return out;
}

/** The key a model request was sent under. */
const keyOf = (request: ChatRequest): string => request.idempotencyKey ?? '(no key)';

/** The receiver's store, with a hook that runs right after a publication committed and before the reply is sent. */
class ObservedStore extends PublicationStore {
  afterCommit: ((receipt: Receipt, key: string) => void) | undefined;

  override publish(publication: Publication, idempotencyKey: string): Receipt {
    const receipt = super.publish(publication, idempotencyKey);
    debug(`publish ${idempotencyKey} duplicate=${receipt.duplicate}`);
    this.afterCommit?.(receipt, idempotencyKey);
    return receipt;
  }
}

/** A few short notes beyond the shipped samples, so the batch keeps going for the whole kill plan. */
function generatedDocument(n: number): DocumentFile {
  const topics = ['lighthouse keeping', 'glacier surveys', 'letterpress printing', 'railway signalling'];
  const topic = topics[n % topics.length] ?? 'field notes';
  const text = [
    `# Chaos note ${n}: ${topic}`,
    '',
    `This note about ${topic} exists so that the chaos test has one more document in flight.`,
    `Its worker may be killed while the model thinks about ${topic}, or right after it was published.`,
    'Either way it must be published exactly once, and no finished step may run again.',
  ].join('\n');
  const bytes = Buffer.from(text, 'utf8');
  return { source: `generated-${n}.md`, documentId: documentIdFor(bytes), title: titleOf(text, ''), bytes };
}

const log = (line: string): void => console.log(`chaos: ${line}`);
const T0 = Date.now();
const debug = (line: string): void => {
  if (process.env.CHAOS_DEBUG) console.log(`chaos debug +${((Date.now() - T0) / 1000).toFixed(2)}: ${line}`);
};

describe('chaos: SIGKILLed workers and restarted servers during a batch', () => {
  const dir = tempDir('chaos-');
  const dataDir = path.join(dir, 'worker-data');
  const dbFilename = path.join(dir, 'temporal.db');
  const taskQueue = `chaos-${randomUUID()}`;
  const workers: WorkerProcess[] = [];
  let port: number;
  let env: TestWorkflowEnvironment | undefined;
  let model: ModelServer;
  const lastAnsweredAt = (): number => Math.max(0, ...model.requests.map((r) => r.answeredAt ?? 0));
  let store: ObservedStore;
  let receiver: Receiver;
  let bundlePath: string;

  const startServer = async (): Promise<TestWorkflowEnvironment> =>
    TestWorkflowEnvironment.createLocal({
      server: {
        executable: temporalExecutable('cli'),
        ip: '127.0.0.1',
        port,
        dbFilename,
        log: { format: 'pretty', level: 'error' },
      },
    });

  const startWorker = async (): Promise<WorkerProcess> => {
    const worker = await startCrashableWorker({
      TEMPORAL_ADDRESS: `127.0.0.1:${port}`,
      TEMPORAL_NAMESPACE: 'default',
      TEMPORAL_TASK_QUEUE: taskQueue,
      DATA_DIR: dataDir,
      OPENAI_BASE_URL: model.baseUrl,
      OPENAI_MODEL: 'chaos-model',
      OPENAI_API_KEY: '',
      PUBLISH_WEBHOOK_URL: receiver.url,
      WORKFLOW_BUNDLE_PATH: bundlePath,
      WORKER_IDENTITY: `chaos-worker-${workers.length + 1}`,
    });
    workers.push(worker);
    return worker;
  };

  before(async () => {
    log(`seed ${SEED} (replay with CHAOS_SEED=${SEED})`);
    Runtime.install({
      logger: new DefaultLogger('ERROR'),
      telemetryOptions: { logging: { filter: { core: 'ERROR', other: 'ERROR' }, forward: {} } },
    });
    port = await freePort();
    env = await startServer();
    bundlePath = await writeWorkflowBundle(dir);
    // A slow paid model: every answer takes 0.3 to 1.5 s, so kills land inside calls.
    model = await startModelServer((request) => {
      debug(`model request ${keyOf(request)}`);
      const content =
        request.step === 'tag' ? '{"tags": ["chaos", "recovery"]}' : `A summary for ${keyOf(request)}.`;
      return { body: completion(content), delayMs: between(300, 1500) };
    });
    store = new ObservedStore(path.join(dir, 'receiver', 'publications.db'));
    receiver = await startReceiver(store);
  });

  after(async () => {
    for (const worker of workers) if (worker.child.exitCode === null) await worker.kill();
    await env?.teardown();
    await receiver?.close();
    store?.close();
    await model?.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it(
    'publishes every document exactly once and never reruns a recorded step',
    { timeout: 280_000 },
    async () => {
      const startedAt = Date.now();
      const plan = shuffled(KILL_KINDS);
      const restartAfter = new Set(shuffled([2, 3, 4, 5, 6, 7, 8, 9]).slice(0, SERVER_RESTARTS));
      log(
        `plan: ${plan.join(', ')}; dev server restarts after kills ${[...restartAfter]
          .sort((a, b) => a - b)
          .map((i) => i + 1)
          .join(' and ')}`,
      );

      const blobs = new BlobStore(dataPaths(dataDir).blobs);
      const samples = collectDocuments([SAMPLES_DIR], 1_000_000).documents;
      assert.equal(samples.length, 4);
      const submitted: DocumentFile[] = [];
      const nextDocument = (): DocumentFile =>
        samples[submitted.length] ?? generatedDocument(submitted.length);

      const kills: { planned: KillKind; landed: KillKind; note: string }[] = [];
      // Keeps up to IN_FLIGHT documents unpublished while the plan runs, adding one at most every SUBMIT_EVERY_MS;
      // a submission that meets a stopped server is retried.
      let feeding = true;
      let lastSubmitAt = 0;
      const feeder = (async () => {
        while (feeding) {
          const published = store.countPublications();
          const current = env;
          const due = Date.now() - lastSubmitAt >= SUBMIT_EVERY_MS;
          if (current !== undefined && due && submitted.length - published < IN_FLIGHT) {
            const document = nextDocument();
            try {
              await submitDocument(current.client, blobs, taskQueue, document);
              submitted.push(document);
              lastSubmitAt = Date.now();
              debug(`submitted ${document.source}`);
              continue;
            } catch {
              // The dev server is restarting; try again with the next client.
            }
          }
          await sleep(100);
        }
      })();

      let worker = await startWorker();
      const requestsFor = (key: string): number => model.requests.filter((c) => keyOf(c) === key).length;
      const safeToKill = (): boolean =>
        model.open().every((c) => requestsFor(keyOf(c)) <= MAX_ATTEMPT_TO_KILL);
      const waitUntil = async (ready: () => boolean, timeoutMs: number): Promise<boolean> => {
        const deadline = Date.now() + timeoutMs;
        while (Date.now() < deadline) {
          if (ready()) return true;
          await sleep(10);
        }
        return false;
      };
      const inFlight = (): string =>
        model
          .open()
          .map((c) => `${c.step} attempt ${requestsFor(keyOf(c))}`)
          .join(', ') || 'no model call open';

      /** Waits for a moment of the planned kind (or, if none comes, any moment) and SIGKILLs the worker there. */
      const killAt = async (kind: KillKind): Promise<{ landed: KillKind; note: string }> => {
        const victim = worker;
        if (kind === 'after publish') {
          const committed = new Promise<string>((resolve) => {
            store.afterCommit = (receipt, key) => {
              if (receipt.duplicate || !safeToKill()) return;
              store.afterCommit = undefined;
              const open = inFlight();
              victim.child.kill('SIGKILL');
              resolve(`right after the publish effect under ${key} committed, before the reply (${open})`);
            };
          });
          // An unref'd timer, so a wait that lost the race does not keep the test process alive.
          const note = await Promise.race([
            committed,
            sleep(WAIT_FOR_MOMENT_MS, undefined, { ref: false }).then(() => undefined),
          ]);
          store.afterCommit = undefined;
          if (note !== undefined) {
            await victim.exited;
            return { landed: kind, note };
          }
        } else if (kind === 'model call') {
          const armedAt = Date.now();
          const found = await waitUntil(
            () => model.open().some((c) => c.receivedAt >= armedAt) && safeToKill(),
            WAIT_FOR_MOMENT_MS,
          );
          if (found) {
            await sleep(between(0, 150));
            if (model.open().length > 0 && safeToKill()) {
              const note = `while the model server held open request(s): ${inFlight()}`;
              await victim.kill();
              return { landed: kind, note };
            }
          }
        } else if (kind === 'between steps') {
          const armedAt = Date.now();
          const found = await waitUntil(
            () => lastAnsweredAt() > armedAt && model.open().length === 0,
            WAIT_FOR_MOMENT_MS,
          );
          if (found) {
            await sleep(between(0, 200));
            if (safeToKill()) {
              const note = `just after a model answer was delivered, between steps (${inFlight()})`;
              await victim.kill();
              return { landed: kind, note };
            }
          }
        }
        await waitUntil(safeToKill, WAIT_FOR_MOMENT_MS);
        const note = `at a random moment (${inFlight()})${kind === 'random moment' ? '' : `; no "${kind}" moment came`}`;
        await victim.kill();
        return { landed: 'random moment', note };
      };

      let serverRestarts = 0;
      for (const [i, kind] of plan.entries()) {
        await sleep(between(300, 2_000));
        const { landed, note } = await killAt(kind);
        kills.push({ planned: kind, landed, note });
        log(`kill ${kills.length} (${landed}): SIGKILL ${worker.identity} ${note}`);
        debug(`killed ${worker.identity}`);
        worker = await startWorker();
        if (restartAfter.has(i)) {
          await sleep(between(300, 2_000));
          const stopped = Date.now();
          const old = env;
          env = undefined;
          await old?.teardown();
          await sleep(between(500, 2_000));
          env = await startServer();
          serverRestarts += 1;
          const survived = await Promise.race([
            worker.exited.then(() => false),
            sleep(1_000).then(() => true),
          ]);
          log(
            `dev server restart ${serverRestarts}: down ${((Date.now() - stopped) / 1000).toFixed(1)} s on the same ` +
              `database; worker ${worker.identity} ${survived ? 'survived and reconnected' : 'died, starting another'}`,
          );
          if (!survived) worker = await startWorker();
        }
      }
      feeding = false;
      await feeder;

      // Wait for every run on the latest server connection, then read the evidence.
      const client = env?.client;
      assert.ok(client);
      const results = new Map<string, PipelineResult>();
      for (const document of submitted) {
        const handle = client.workflow.getHandle(workflowIdFor(document.documentId));
        results.set(document.documentId, await handle.result());
      }
      const finishedAt = Date.now();

      // The evidence, all from outside the killed processes: the history, the model server's request log and the
      // publish target's database. Problems are collected first so that a failing run still prints its figures.
      const problems: string[] = [];
      const check = (ok: boolean, problem: string): void => {
        if (!ok) problems.push(problem);
      };
      const deliveries = store.deliveries();
      const attempts = new Map<StepName, number>();
      let rerunsAfterCompletion = 0;
      let duplicatePublications = 0;
      let paidTwice = 0;
      for (const document of submitted) {
        const id = document.documentId;
        const what = `${document.source} (${id})`;
        const history = await client.workflow.getHandle(workflowIdFor(id)).fetchHistory();
        const report = recoveryReport(history, 0);
        const runId = report.runId ?? '(no run ID)';

        // Published exactly once: one revision, written under this run's publish key, and every delivery (the
        // first and each retry after a crash) carried that same key.
        const publishKey = `${runId}:publish`;
        const revisions = store.revisionsOf(id);
        duplicatePublications += Math.max(0, revisions.length - 1);
        check(
          revisions.length === 1 && revisions[0]?.idempotencyKey === publishKey,
          `${what}: revisions ${JSON.stringify(revisions)}, expected one under ${publishKey}`,
        );
        check(results.get(id)?.publication.revision === 1, `${what}: the run's receipt is not revision 1`);
        const ofDocument = deliveries.filter((d) => d.documentId === id);
        const foreignKeys = ofDocument.filter((d) => d.idempotencyKey !== publishKey);
        check(
          foreignKeys.length === 0,
          `${what}: deliveries under other keys ${JSON.stringify(foreignKeys)}`,
        );
        const created = ofDocument.filter((d) => d.outcome === 'created').length;
        check(created === 1, `${what}: ${created} deliveries created a publication`);

        // No step whose completion the history recorded ran again: no request or delivery with its key arrived
        // after the completion, and there were never more of them than attempts the history records.
        for (const step of report.steps) {
          const key = `${runId}:${step.step}`;
          check(step.status === 'completed', `${key}: ${step.status}`);
          check(step.idempotencyKey === key, `${key}: the result names key ${step.idempotencyKey ?? '-'}`);
          attempts.set(step.step, (attempts.get(step.step) ?? 0) + step.attempts);
          const arrivals =
            step.step === 'publish'
              ? ofDocument.map((d) => Date.parse(d.receivedAt))
              : model.requests.filter((c) => keyOf(c) === key).map((c) => c.receivedAt);
          check(arrivals.length >= 1, `${key} never reached its target`);
          check(
            arrivals.length <= step.attempts,
            `${key}: ${arrivals.length} calls for ${step.attempts} recorded attempt(s)`,
          );
          const late = arrivals.filter((t) => t > (step.completedAt ?? 0) + CLOCK_TOLERANCE_MS);
          rerunsAfterCompletion += late.length;
          check(late.length === 0, `${key}: ${late.length} call(s) after its completion was recorded`);
          if (step.step !== 'publish') {
            const answered = model.requests.filter(
              (c) => keyOf(c) === key && c.answeredAt !== undefined,
            ).length;
            paidTwice += Math.max(0, answered - 1);
          }
        }
      }
      check(
        store.countPublications() === submitted.length,
        `${store.countPublications()} publications for ${submitted.length} documents`,
      );

      const memo = new AnswerMemo(dataPaths(dataDir).memo);
      const memoRows = memo.count();
      memo.close();
      check(
        memoRows === submitted.length * 2,
        `${memoRows} memoised answers for ${submitted.length * 2} model steps`,
      );

      const byKind = (kind: KillKind): number => kills.filter((k) => k.landed === kind).length;
      const duplicatesAnswered = deliveries.filter((d) => d.outcome === 'duplicate').length;
      const calls = (step: StepName): number => model.requests.filter((c) => c.step === step).length;
      const figures = [
        `seed ${SEED}`,
        `kills ${kills.length} (model call ${byKind('model call')}, after publish ${byKind('after publish')}, ` +
          `between steps ${byKind('between steps')}, random moment ${byKind('random moment')})`,
        `dev server restarts ${serverRestarts}`,
        `worker processes ${workers.length}`,
        `documents ${submitted.length}, each published once (revisions 1, publications ${store.countPublications()})`,
        `executions per step: summarize ${calls('summarize')} model requests / ${attempts.get('summarize') ?? 0} recorded attempts, ` +
          `tag ${calls('tag')} / ${attempts.get('tag') ?? 0}, publish ${deliveries.length} deliveries / ${attempts.get('publish') ?? 0}` +
          ` (${duplicatesAnswered} retries answered with the first receipt)`,
        `model answers sent ${model.requests.filter((c) => c.answeredAt !== undefined).length}, memo rows ${memoRows}, ` +
          `keys answered twice ${paidTwice} (the worker died between the answer and the memo write)`,
        `reruns after a recorded completion ${rerunsAfterCompletion}, duplicate publications ${duplicatePublications}`,
        `${((finishedAt - startedAt) / 1000).toFixed(0)} s`,
      ];
      log(`figures: ${figures.join('; ')}`);

      assert.deepEqual(problems, []);
      assert.ok(kills.length >= 10);
      assert.equal(serverRestarts, SERVER_RESTARTS);
      assert.ok(byKind('model call') >= 1, 'at least one kill while the model server held a request');
      assert.ok(byKind('after publish') >= 1, 'at least one kill right after the publish effect');
      assert.ok(byKind('between steps') >= 1, 'at least one kill between steps');
      assert.ok(
        duplicatesAnswered >= byKind('after publish'),
        'each kill after a publish was followed by a keyed retry',
      );
    },
  );
});
