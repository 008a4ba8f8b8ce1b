/**
 * Chaos on a fleet. Two worker hosts (two worker processes, each with its own DATA_DIR, both on one DATABASE_URL)
 * run a batch while the test SIGKILLs them, freezes them (SIGSTOP, then SIGCONT after longer than the heartbeat
 * timeout, so Temporal hands the step to the other host) and restarts the Temporal dev server. The model server
 * and the webhook receiver are real HTTP servers in this process, one route per host, so the evidence is gathered
 * outside the processes being killed: each memo key paid once, each document published once per version, nothing
 * lost. It runs twice: against a receiver that dedupes by Idempotency-Key (and echoes it), and against one that
 * ignores the key, where only the delivery ledger stands between a retry and a second effect. There the test also
 * plays the operator: it resolves the deliveries the ledger holds, from the receiver's own log, and wakes their runs
 * as `npm run deliveries -- resolve` does. A run still open near the deadline is described (its pending steps, the
 * open deliveries, the model's open calls) in the failure, rather than left to time out.
 *
 * The moments come from a seeded PRNG; the seed is printed first. CHAOS_SEED=<seed> replays the plan and delays
 * (the interleaving still depends on timing); CHAOS_DEBUG=1 logs every request with a time; CHAOS_LENGTH=full (as
 * .ci/run sets) plays the whole plan, the default a short one.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { randomInt, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { loadConfig, SAMPLES_DIR } from '../src/config';
import { PublishInputSchema, workflowIdFor } from '../src/contract';
import { deliverySettledSignal } from '../src/workflow/queries';
import { collectDocuments, titleOf } from '../src/documents/files';
import type { DocumentFile } from '../src/documents/files';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import type { PublicationStore } from '../src/publisher/publication-store';
import { startReceiver } from '../src/publisher/receiver';
import type { Publication, Receipt } from '../src/publisher/types';
import { startLink } from '../demo/link';
import type { Link } from '../demo/link';
import { submitDocument } from '../src/runs/submit';
import { openStores } from '../src/store/open';
import type { Stores } from '../src/store/open';
import type { WorkerProcess } from '../demo/worker-process';
import { startModelServer } from '../demo/model-server';
import type { ChatRequest, ModelServer } from '../demo/model-server';
import { startCrossReferenceServer } from '../demo/cross-reference-server';
import type { CrossReferenceServer } from '../demo/cross-reference-server';
import { ManifestWriter } from '../src/documents/manifest';
import type { AgentSettings } from '../src/contract';
import type { PipelineResult } from '../src/cli/compose';
import { plannedTurn } from './agent-model';
import { closeServer, listenOnLoopback, readBody } from '../src/lib/loopback';
import { completion, startCrashableWorker, writeWorkflowBundle } from './helpers';
import { mulberry32 } from './random';
import { freePort, tempDir } from './scratch';
import { freshDatabase, onDatabase } from './postgres';
import { startLocalDevServer } from '../src/temporal/local-server';
import { pendingSteps } from '../src/runs/history';
import type { Client } from '@temporalio/client';

const SEED = process.env.CHAOS_SEED ? Number(process.env.CHAOS_SEED) : randomInt(2 ** 31);
if (!Number.isSafeInteger(SEED))
  throw new Error(`CHAOS_SEED must be a whole number, not "${process.env.CHAOS_SEED}"`);

type EventKind =
  | 'kill in a model call'
  | 'kill after a publish'
  | 'kill after a cross-reference'
  | 'stall in a model call'
  | 'kill at random';
/**
 * How long the run is: `full` (what .ci/run sets) plays the whole plan; `short`, the default of `npm test`, one
 * event of each kind that needs a moment (and the dev server restart), so the suite stays quick on a laptop.
 */
const CHAOS_LENGTH = process.env.CHAOS_LENGTH ?? 'short';
if (CHAOS_LENGTH !== 'short' && CHAOS_LENGTH !== 'full') {
  throw new Error(`CHAOS_LENGTH must be short or full, not "${CHAOS_LENGTH}"`);
}
/** The plan of one run, shuffled with the seed. */
const EVENTS: EventKind[] =
  CHAOS_LENGTH === 'full'
    ? [
        ...Array<EventKind>(3).fill('kill in a model call'),
        ...Array<EventKind>(2).fill('kill after a publish'),
        'kill after a cross-reference',
        ...Array<EventKind>(2).fill('stall in a model call'),
        'kill at random',
      ]
    : [
        'kill in a model call',
        'kill after a publish',
        'kill after a cross-reference',
        'stall in a model call',
      ];
const SERVER_RESTARTS = 1;
/**
 * A stall outlasts the heartbeat timeout (10 s) plus the first retry's wait (2 s), so the other host takes the
 * step over and finds the frozen host's claim; it stays inside the claim's 30 s lease (renewed every 2 s).
 */
const STALL_MS: [number, number] = [16_000, 22_000];
/** How long to wait for a moment of the planned kind before acting at whatever moment it is. */
const WAIT_FOR_MOMENT_MS = 20_000;
/** Turns of the related step's loop as the stand-in model plans it (test/agent-model.ts): search, file, answer. */
const AGENT_TURNS = 3;
/** Documents kept unpublished while the plan runs. */
const IN_FLIGHT = 4;
const SUBMIT_EVERY_MS = 1_500;
/** The operator looks at a delivery only once its claim is this old, then settles it from the receiver's log. */
const OPERATOR_GRACE_MS = 25_000;
/** The operator calls a delivery with no effect at the receiver "not delivered" only when its claim is this old. */
const OPERATOR_PATIENCE_MS = 45_000;
const HOSTS = ['host-a', 'host-b'] as const;
/**
 * How long a worker process may take to start polling. Loading tsx and the SDK takes ~3 s of CPU; with both cores
 * busy beside five test files it has taken over 60 s, and a start that never comes is reported as starved.
 */
const WORKER_READY_MS = 150_000;
type HostName = (typeof HOSTS)[number];
/**
 * A scenario's deadline; the last DIAGNOSIS_MS of it go to describing the runs still open, if any are. A full run
 * takes ~2 minutes alone; beside the other test files on two cores it has taken 6.5 (the runner allows 10).
 */
const TEST_TIMEOUT_MS = 540_000;
const DIAGNOSIS_MS = 30_000;

/** The scenario's own stream of choices: the two scenarios run at once, each replayable from the seed. */
function seededChoices(seed: number) {
  const random = mulberry32(seed);
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
  return { random, between, shuffled };
}

const T0 = Date.now();
/** A scenario's log lines, named for it: the two scenarios write at once. */
function scenarioLog(name: string) {
  return {
    log: (line: string): void => console.log(`chaos (${name}): ${line}`),
    debug: (line: string): void => {
      if (process.env.CHAOS_DEBUG)
        console.log(`chaos (${name}) debug +${((Date.now() - T0) / 1000).toFixed(2)}: ${line}`);
    },
  };
}
const keyOf = (request: ChatRequest): string => request.idempotencyKey ?? '(no key)';

/**
 * When each memoised answer was recorded (ms), by the provider's key `<runId>:<step>`: the row's `updated_at`, whose
 * last write is the one that stores the answer (a claim of an answered row, a renewal or a release write nothing).
 */
async function memoRecordedAt(databaseUrl: string): Promise<Map<string, number>> {
  const recorded = new Map<string, number>();
  await onDatabase(databaseUrl, async (client) => {
    const result = await client.query<{ run_id: string; step: string; updated_at: Date }>(
      'SELECT run_id, step, updated_at FROM model_memo WHERE answer IS NOT NULL',
    );
    for (const row of result.rows) recorded.set(`${row.run_id}:${row.step}`, row.updated_at.getTime());
  });
  return recorded;
}

/** One POST that changed something at the receiver. */
interface Effect {
  host: string;
  key: string;
  documentId: string;
  revision: number;
}

/**
 * The publish target. Each host posts through a link of its own (demo/link.ts), so every delivery is
 * traced to its host. With `dedupes`, the target is the real receiver (startReceiver) over a publication store
 * that reports each write; without, a stand-in that takes every POST as a new effect and ignores the key, as
 * many real webhooks do. `afterEffect` runs after an effect and before the reply.
 */
async function startFleetReceiver(
  dedupes: boolean,
  dir: string,
  debug: (line: string) => void,
): Promise<{
  urlFor(host: HostName): string;
  effects: Effect[];
  posts: number;
  afterEffect: ((effect: Effect) => void) | undefined;
  close(): Promise<void>;
}> {
  const state = {
    effects: [] as Effect[],
    posts: 0,
    afterEffect: undefined as ((effect: Effect) => void) | undefined,
  };
  /** The host that last sent each key, as its link saw it pass. */
  const senders = new Map<string, string>();
  const took = (key: string, documentId: string, revision: number): void => {
    const effect = { host: senders.get(key) ?? '?', key, documentId, revision };
    debug(`receiver: ${key} from ${effect.host} took effect`);
    state.effects.push(effect);
    state.afterEffect?.(effect);
  };
  const closers: (() => Promise<void>)[] = [];
  let targetUrl: string;
  if (dedupes) {
    const store = new SqlitePublicationStore(path.join(dir, 'receiver.db'));
    const observed = Object.assign(Object.create(store) as PublicationStore, {
      publish: async (publication: Publication, key: string): Promise<Receipt> => {
        state.posts += 1;
        const receipt = await store.publish(publication, key);
        if (!receipt.duplicate && receipt.superseded !== true)
          took(key, receipt.documentId, receipt.revision);
        return receipt;
      },
    });
    const receiver = await startReceiver(observed);
    closers.push(
      () => receiver.close(),
      () => store.close(),
    );
    targetUrl = receiver.url;
  } else {
    const server = http.createServer((req, res) => {
      void readBody(req).then((body) => {
        const publication = PublishInputSchema.parse(JSON.parse(body.toString('utf8')));
        state.posts += 1;
        const revision = state.effects.filter((e) => e.documentId === publication.documentId).length + 1;
        took(String(req.headers['idempotency-key']), publication.documentId, revision);
        if (!res.destroyed)
          res.writeHead(201, { 'content-type': 'application/json' }).end(`{"revision":${revision}}`);
      });
    });
    const origin = await listenOnLoopback(server, 'receiver');
    closers.push(() => closeServer(server));
    targetUrl = `${origin}/publications`;
  }
  const links = new Map<HostName, Link>();
  for (const host of HOSTS) {
    // The link asks `hold` about every request before it forwards it: the moment to note who sent the key.
    const link = await startLink(targetUrl, {
      hold: ({ key }) => {
        if (key !== undefined) senders.set(key, host);
        return false;
      },
    });
    links.set(host, link);
    closers.unshift(() => link.close());
  }
  return Object.assign(state, {
    urlFor: (host: HostName) => links.get(host)?.url ?? '',
    close: async () => {
      for (const close of closers) await close();
    },
  });
}

/**
 * The agent step's receiver of cross-references (demo/cross-reference-server.ts, which dedupes by Idempotency-Key,
 * as the related step's changing tool relies on), behind a link per host, so each effect is traced to the host
 * that sent it. `afterEffect` runs after an effect and before the reply, with the sending host.
 */
async function startFleetCrossReferences(): Promise<{
  server: CrossReferenceServer;
  urlFor(host: HostName): string;
  hostOf(key: string): HostName | undefined;
  close(): Promise<void>;
}> {
  const server = await startCrossReferenceServer();
  const senders = new Map<string, HostName>();
  const links = new Map<HostName, Link>();
  for (const host of HOSTS) {
    const link = await startLink(server.url, {
      hold: ({ key }) => {
        if (key !== undefined) senders.set(key, host);
        return false;
      },
    });
    links.set(host, link);
  }
  return {
    server,
    urlFor: (host) => links.get(host)?.url ?? '',
    hostOf: (key) => senders.get(key),
    close: async () => {
      for (const link of links.values()) await link.close();
      await server.close();
    },
  };
}

/** A few short notes beyond the shipped samples, so the batch keeps going for the whole plan. */
function generatedDocument(n: number, version = 1): DocumentFile {
  const topics = ['lighthouse keeping', 'glacier surveys', 'letterpress printing', 'railway signalling'];
  const topic = topics[n % topics.length] ?? 'field notes';
  const text = [
    `# Chaos note ${n}: ${topic}`,
    '',
    `This note about ${topic} exists so that the chaos test has one more document in flight.`,
    `Its worker may be killed or frozen while the model thinks about ${topic}, or right after it was published.`,
    `Either way each version of it must be published exactly once. This is version ${version}.`,
  ].join('\n');
  return {
    source: `generated-${n}.md`,
    documentId: `chaos-note-${n}`,
    title: titleOf(text, ''),
    bytes: Buffer.from(text, 'utf8'),
  };
}

/** The documents whose latest run has not completed by `deadline` (a failed run throws, as result() does). */
async function unfinishedRuns(client: Client, documentIds: string[], deadline: number): Promise<string[]> {
  const open: string[] = [];
  for (const documentId of documentIds) {
    const result = client.workflow.getHandle(workflowIdFor(documentId)).result();
    const left = Math.max(0, deadline - Date.now());
    const done = await Promise.race([result.then(() => true), sleep(left, false, { ref: false })]);
    if (!done) {
      result.catch(() => undefined);
      open.push(documentId);
    }
  }
  return open;
}

/** What each stuck run waits on: its pending steps, the ledger's open deliveries and the model's open calls. */
async function diagnosis(
  client: Client,
  documentIds: string[],
  stores: Stores,
  model: ModelServer,
): Promise<string[]> {
  const lines: string[] = [];
  for (const documentId of documentIds) {
    const workflowId = workflowIdFor(documentId);
    try {
      const described = await client.workflow.getHandle(workflowId).describe();
      const steps = pendingSteps(described.raw.pendingActivities).map(
        (s) =>
          `${s.step} attempt ${s.attempt} ${s.state} (last worker ${s.lastWorker ?? '-'}; ` +
          `last failure ${s.lastFailure ?? '-'})`,
      );
      lines.push(
        `${workflowId} run ${described.runId} ${described.status.name}: ` +
          `${steps.length === 0 ? 'no pending step' : steps.join('; ')}`,
      );
    } catch (err) {
      lines.push(`${workflowId}: cannot describe (${String(err)})`);
    }
  }
  for (const entry of await stores.ledger.openClaims()) {
    lines.push(
      `open delivery ${entry.idempotencyKey} of ${entry.documentId}: owner ${entry.owner ?? '-'}, ` +
        `attempts ${entry.attempts}, last error ${entry.lastError ?? '-'}, since ${entry.updatedAt.toISOString()}`,
    );
  }
  for (const call of model.open()) {
    lines.push(`model call open: ${call.step} ${keyOf(call)} via ${call.route ?? '?'}`);
  }
  return lines;
}

Runtime.install({
  logger: new DefaultLogger('ERROR'),
  telemetryOptions: { logging: { filter: { core: 'ERROR', other: 'ERROR' }, forward: {} } },
});

// The two scenarios run at once: each has its own server, workers, model server, receiver and database, and most
// of a scenario is waiting (for slow answers, heartbeat timeouts, stalls).
describe('chaos', { concurrency: true }, () => {
  for (const dedupes of [true, false]) {
    const receiverKind = dedupes
      ? 'a receiver that dedupes by key'
      : 'a receiver that ignores Idempotency-Key';
    const { random, between, shuffled } = seededChoices(dedupes ? SEED : SEED + 1);
    const { log, debug } = scenarioLog(dedupes ? 'dedupes' : 'ignores key');
    describe(`chaos on two worker hosts sharing PostgreSQL, with ${receiverKind}`, () => {
      const dir = tempDir('chaos-');
      const dbFilename = path.join(dir, 'temporal.db');
      const taskQueue = `chaos-${randomUUID()}`;
      const processes: WorkerProcess[] = [];
      const workers = new Map<HostName, WorkerProcess>();
      const cleanups: (() => Promise<void>)[] = [];
      let databaseUrl: string;
      let port: number;
      let env: TestWorkflowEnvironment | undefined;
      let model: ModelServer;
      let receiver: Awaited<ReturnType<typeof startFleetReceiver>>;
      let xrefs: Awaited<ReturnType<typeof startFleetCrossReferences>>;
      let stores: Stores;
      let bundlePath: string;
      /** Set by `after`: a scenario that failed (or timed out) stops its feeder and operator with it. */
      let over = false;

      /** The dev server on its port and database file; the SDK gives it 5 s to answer, so a busy machine retries. */
      const startServer = async (): Promise<TestWorkflowEnvironment> => {
        for (let attempt = 1; ; attempt++) {
          try {
            return await startLocalDevServer(loadConfig(), { port, dbFilename });
          } catch (err) {
            if (attempt === 3) throw err;
            log(`the dev server did not start (${String(err).slice(0, 120)}); trying again`);
            await sleep(2_000);
          }
        }
      };

      const startWorker = async (host: HostName): Promise<WorkerProcess> => {
        const worker = await startCrashableWorker(
          {
            TEMPORAL_ADDRESS: `127.0.0.1:${port}`,
            TEMPORAL_NAMESPACE: 'default',
            TEMPORAL_TASK_QUEUE: taskQueue,
            DATA_DIR: path.join(dir, host),
            DATABASE_URL: databaseUrl,
            OPENAI_BASE_URL: model.baseUrl.replace(/\/v1$/, `/${host}/v1`),
            OPENAI_MODEL: 'chaos-model',
            MODEL: '',
            OPENAI_API_KEY: '',
            PUBLISH_WEBHOOK_URL: receiver.urlFor(host),
            AGENT_TOOL_URL: xrefs.urlFor(host),
            WORKFLOW_BUNDLE_PATH: bundlePath,
            WORKER_IDENTITY: `${host}-worker-${processes.length + 1}`,
          },
          WORKER_READY_MS,
        );
        processes.push(worker);
        workers.set(host, worker);
        return worker;
      };

      before(async () => {
        log(`seed ${SEED} (replay with CHAOS_SEED=${SEED}); ${CHAOS_LENGTH} run; ${receiverKind}`);
        const defer = (cleanup: () => Promise<void> | void): void => {
          cleanups.push(async () => cleanup());
        };
        databaseUrl = await freshDatabase(defer);
        port = await freePort();
        env = await startServer();
        bundlePath = await writeWorkflowBundle(dir);
        // A slow paid model: every answer takes 1 to 3 s, so kills and stalls land inside calls.
        model = await startModelServer((request) => {
          debug(`model: ${request.step} ${keyOf(request)} via ${request.route ?? '?'}`);
          // An agent turn is answered with the related step's next tool call (OpenAI's tool_calls), a little
          // faster than the one-question steps, so a loop of three turns does not stretch the run much.
          if (request.step === 'related') return { ...plannedTurn(request), delayMs: between(500, 1_500) };
          const content =
            request.step === 'tag' ? '{"tags": ["chaos", "recovery"]}' : `A summary for ${keyOf(request)}.`;
          return { body: completion(content), delayMs: between(1_000, 3_000) };
        });
        receiver = await startFleetReceiver(dedupes, dir, debug);
        xrefs = await startFleetCrossReferences();
        stores = await openStores(
          loadConfig({ DATABASE_URL: databaseUrl, DATA_DIR: path.join(dir, 'client') }),
        );
      });

      after(
        async () => {
          over = true;
          for (const worker of processes) {
            if (worker.child.exitCode === null && worker.child.signalCode === null) {
              worker.child.kill('SIGCONT');
              await worker.kill();
            }
          }
          await env?.teardown();
          await receiver?.close();
          await xrefs?.close();
          await model?.close();
          await stores?.close();
          for (const cleanup of cleanups.reverse()) await cleanup();
          fs.rmSync(dir, { recursive: true, force: true });
        },
        { timeout: 60_000 },
      );

      it(
        'pays each model answer once, publishes each version of each document once, and loses nothing',
        { timeout: TEST_TIMEOUT_MS },
        async () => {
          const startedAt = Date.now();
          /** When the final waits give up, leaving DIAGNOSIS_MS of the test's deadline to describe what is open. */
          const settleBy = startedAt + TEST_TIMEOUT_MS - DIAGNOSIS_MS;
          const plan = shuffled(EVENTS);
          const restartAfter = new Set(
            shuffled(Array.from({ length: Math.min(5, EVENTS.length - 1) }, (_, i) => i + 1)).slice(
              0,
              SERVER_RESTARTS,
            ),
          );
          log(
            `plan: ${plan.join(', ')}; dev server restart after event(s) ${[...restartAfter].map((i) => i + 1)}`,
          );
          for (const host of HOSTS) await startWorker(host);

          // The client: documents go to the shared blob store; each run is followed to its end.
          const samples = collectDocuments([SAMPLES_DIR], 1_000_000).documents;
          assert.equal(samples.length, 4);
          const versions = new Map<string, number>();
          const submitted: DocumentFile[] = [];
          // Every other document runs its agent step (the related step, AGENT=on) over the samples as its corpus:
          // the kills land inside agent loops as well as in runs without one.
          const corpus = new ManifestWriter(stores.blobs);
          for (const sample of samples) {
            await corpus.add({
              documentId: sample.documentId,
              textRef: await stores.blobs.put(sample.bytes),
              title: sample.title,
              source: sample.source,
            });
          }
          const { manifestRef: corpusRef } = await corpus.finish();
          assert.ok(corpusRef !== undefined);
          const agent: AgentSettings = { maxTurns: 8, maxTokens: 200_000, historyEvents: 2_000, corpusRef };
          const agentDocuments = new Set<string>();
          /** Versions submitted with the agent on. */
          let agentVersions = 0;
          let feeding = true;
          let lastSubmitAt = 0;
          /** The submission under way, if any: one that never returns is named when the test gives up. */
          let submitting: { source: string; since: number } | undefined;
          const submit = async (document: DocumentFile): Promise<void> => {
            const current = env;
            if (current === undefined) throw new Error('the dev server is restarting');
            submitting = { source: document.source, since: Date.now() };
            try {
              if (!versions.has(document.documentId) && versions.size % 2 === 0)
                agentDocuments.add(document.documentId);
              const withAgent = agentDocuments.has(document.documentId);
              await submitDocument(
                current.client,
                stores.blobs,
                taskQueue,
                document,
                {},
                withAgent ? { agent } : {},
              );
              if (withAgent) agentVersions += 1;
            } finally {
              submitting = undefined;
            }
            submitted.push(document);
            versions.set(document.documentId, (versions.get(document.documentId) ?? 0) + 1);
            lastSubmitAt = Date.now();
            debug(`submitted ${document.source} (${document.documentId})`);
          };
          const feeder = (async () => {
            while (feeding && !over) {
              const due = Date.now() - lastSubmitAt >= SUBMIT_EVERY_MS;
              const published = new Set(receiver.effects.map((e) => e.key)).size;
              if (due && submitted.length - published < IN_FLIGHT) {
                const n = versions.size;
                try {
                  await submit(samples[n] ?? generatedDocument(n));
                  continue;
                } catch {
                  // The dev server is restarting: try again in a moment.
                }
              }
              await sleep(100);
            }
          })();

          // The operator: resolves the deliveries the ledger holds, from what the receiver's own log shows. It
          // leaves a claim alone for a while: a POST may be under way, and a claim on a receiver that has echoed a
          // key is sent again by the next retry without anyone's help.
          const verdicts = { delivered: 0, unsent: 0 };
          /** Fails the test with what each open run waits on, also logged as it is found. */
          const failWithOpenRuns = async (
            client: Client,
            heading: string,
            open: string[],
          ): Promise<never> => {
            const lines = await diagnosis(client, open, stores, model);
            for (const line of lines) log(`stuck: ${line}`);
            assert.fail(`${heading}:\n${lines.join('\n')}`);
          };
          // As `npm run deliveries -- resolve` does: the held run looks at the ledger now, not at its next timer
          // (30 s, then doubling), which a run held more than once would wait out past the test's deadline.
          const wake = async (workflowId: string): Promise<void> => {
            await env?.client.workflow
              .getHandle(workflowId)
              .signal(deliverySettledSignal)
              .catch(() => undefined);
          };
          let operating = true;
          const operator = (async () => {
            while (operating && !over) {
              for (const entry of await stores.ledger.openClaims()) {
                if (Date.now() - entry.updatedAt.getTime() < OPERATOR_GRACE_MS) continue;
                const effect = receiver.effects.find((e) => e.key === entry.idempotencyKey);
                if (effect !== undefined) {
                  const receipt = {
                    documentId: effect.documentId,
                    revision: effect.revision,
                    duplicate: true,
                  };
                  if (await stores.ledger.resolve(entry, { delivered: receipt })) {
                    verdicts.delivered += 1;
                    await wake(entry.workflowId);
                  }
                } else if (entry.ageMs > OPERATOR_PATIENCE_MS) {
                  if (await stores.ledger.resolve(entry, 'unsent')) {
                    verdicts.unsent += 1;
                    await wake(entry.workflowId);
                  }
                }
              }
              await sleep(1_000);
            }
          })();

          const kills: { host: HostName; at: number }[] = [];
          const stalls: { host: HostName; key: string; since: number; ms: number; continuedAt: number }[] =
            [];
          const events: { planned: EventKind; landed: string }[] = [];
          const waitUntil = async (ready: () => boolean, timeoutMs: number): Promise<boolean> => {
            const deadline = Date.now() + timeoutMs;
            while (Date.now() < deadline) {
              if (ready()) return true;
              await sleep(10);
            }
            return false;
          };
          const kill = async (host: HostName): Promise<void> => {
            const victim = workers.get(host);
            assert.ok(victim);
            kills.push({ host, at: Date.now() });
            await victim.kill();
            debug(`killed ${victim.identity}`);
            await startWorker(host);
          };
          /** The newest open model call, once one arrives after `since`. */
          const openCall = async (since: number): Promise<ChatRequest | undefined> => {
            let found: ChatRequest | undefined;
            await waitUntil(() => {
              found = model.open().find((r) => r.receivedAt >= since && r.route !== undefined);
              return found !== undefined;
            }, WAIT_FOR_MOMENT_MS);
            return found;
          };
          const hostOf = (request: ChatRequest): HostName =>
            request.route === 'host-b' ? 'host-b' : 'host-a';
          const anyHost = (): HostName => (random() < 0.5 ? 'host-a' : 'host-b');

          const act = async (kind: EventKind): Promise<string> => {
            if (kind === 'kill after a cross-reference') {
              const killed = new Promise<HostName | undefined>((resolve) => {
                xrefs.server.afterEffect = (key) => {
                  xrefs.server.afterEffect = undefined;
                  const host = xrefs.hostOf(key);
                  if (host !== undefined) workers.get(host)?.child.kill('SIGKILL');
                  resolve(host);
                };
              });
              const host = await Promise.race([
                killed,
                sleep(WAIT_FOR_MOMENT_MS, undefined, { ref: false }).then(() => undefined),
              ]);
              xrefs.server.afterEffect = undefined;
              if (host !== undefined) {
                await kill(host);
                return `SIGKILL ${host} in an agent loop, right after its cross-reference took effect, before the reply`;
              }
            } else if (kind === 'kill after a publish') {
              const killed = new Promise<string>((resolve) => {
                receiver.afterEffect = (effect) => {
                  receiver.afterEffect = undefined;
                  const host = effect.host === 'host-b' ? 'host-b' : 'host-a';
                  workers.get(host)?.child.kill('SIGKILL');
                  resolve(host);
                };
              });
              const host = await Promise.race([
                killed,
                sleep(WAIT_FOR_MOMENT_MS, undefined, { ref: false }).then(() => undefined),
              ]);
              receiver.afterEffect = undefined;
              if (host === 'host-a' || host === 'host-b') {
                await kill(host);
                return `SIGKILL ${host} right after its delivery took effect, before the reply`;
              }
            } else if (kind !== 'kill at random') {
              const call = await openCall(Date.now());
              if (call !== undefined) {
                const host = hostOf(call);
                if (kind === 'kill in a model call') {
                  await sleep(between(0, 300));
                  await kill(host);
                  return `SIGKILL ${host} while the model server held ${call.step} ${keyOf(call)}`;
                }
                const victim = workers.get(host);
                assert.ok(victim);
                const ms = between(...STALL_MS);
                victim.child.kill('SIGSTOP');
                debug(`stopped ${victim.identity} for ${ms} ms`);
                await sleep(ms);
                victim.child.kill('SIGCONT');
                stalls.push({ host, key: keyOf(call), since: call.receivedAt, ms, continuedAt: Date.now() });
                return `SIGSTOP ${host} for ${(ms / 1000).toFixed(1)} s inside ${call.step} ${keyOf(call)}, then SIGCONT`;
              }
            }
            const host = anyHost();
            await kill(host);
            return `SIGKILL ${host} at a random moment${kind === 'kill at random' ? '' : ` (no "${kind}" moment came)`}`;
          };

          let serverRestarts = 0;
          for (const [i, kind] of plan.entries()) {
            await sleep(between(500, 2_500));
            const landed = await act(kind);
            events.push({ planned: kind, landed });
            log(`event ${events.length}: ${landed}`);
            if (restartAfter.has(i)) {
              const old = env;
              env = undefined;
              const stopped = Date.now();
              await old?.teardown();
              await sleep(between(500, 2_000));
              env = await startServer();
              serverRestarts += 1;
              await sleep(1_000);
              const restarted: string[] = [];
              for (const host of HOSTS) {
                const worker = workers.get(host);
                if (
                  worker === undefined ||
                  worker.child.exitCode !== null ||
                  worker.child.signalCode !== null
                ) {
                  await startWorker(host);
                  restarted.push(host);
                }
              }
              log(
                `dev server restart: down ${((Date.now() - stopped) / 1000).toFixed(1)} s on the same database; ` +
                  `${restarted.length === 0 ? 'both workers reconnected' : `restarted the worker of ${restarted.join(', ')}`}`,
              );
            }
            if (i === 2) {
              // An edit: the first document again with new content, once its first version is done.
              const first = submitted[0];
              const client = env?.client;
              if (first !== undefined && client !== undefined) {
                const open = await unfinishedRuns(client, [first.documentId], settleBy);
                if (open.length > 0)
                  await failWithOpenRuns(client, "the first document's run did not finish", open);
                const text = `${first.bytes.toString('utf8')}\n\nRevised during the chaos run: a second version.\n`;
                await submit({ ...first, bytes: Buffer.from(text, 'utf8') });
                log(`edited ${first.source} and submitted it again (version 2 of ${first.documentId})`);
              }
            }
          }
          feeding = false;
          const planEnded = Date.now();
          // The feeder stops within its 100 ms pause once feeding ends (or when a submission under way returns):
          // it is given that long even when the plan ended at the deadline.
          const fed = await Promise.race([
            feeder.then(() => true),
            sleep(Math.max(2_000, settleBy - Date.now()), false, { ref: false }),
          ]);
          if (!fed) {
            // Past the deadline already when the plan ended (its events waited out moments that never came, as when
            // no run moves): what the runs were waiting on says why, more than the feeder does.
            const stuck = submitting
              ? `the submission of ${submitting.source}, under way for ${Date.now() - submitting.since} ms, never returned`
              : planEnded >= settleBy
                ? `the plan's events ran past the final waits' deadline (${Math.round((planEnded - startedAt) / 1000)} s in)`
                : 'the feeder never returned';
            const current = env?.client;
            if (current === undefined) assert.fail(`${stuck}; the dev server was restarting`);
            const open = await unfinishedRuns(current, [...versions.keys()], Date.now() + 10_000);
            await failWithOpenRuns(current, `${stuck}; ${open.length} run(s) open`, open);
          }

          // Nothing lost: every document's latest run completes, before the test's own deadline; a run still
          // open then is described (its pending steps, the ledger, the model's open calls), not left to time out.
          const client = env?.client;
          assert.ok(client);
          const unfinished = await unfinishedRuns(client, [...versions.keys()], settleBy);
          if (unfinished.length > 0)
            await failWithOpenRuns(client, `${unfinished.length} run(s) did not finish`, unfinished);
          operating = false;
          await operator;
          const finishedAt = Date.now();

          // The evidence, all from outside the worker processes. Problems are collected so the figures print anyway.
          const problems: string[] = [];
          const check = (ok: boolean, problem: string): void => {
            if (!ok) problems.push(problem);
          };
          // Each memo key paid once: per provider key (one per run and step), a second answer only when the memo did
          // not hold the first when the second call went out (its answer was recorded later), and a SIGKILL of the
          // first call's host landed between the two calls: the answer went to a process that died before recording
          // it. Any kill does that, not only the ones aimed at a model call. Evidence, not a timing window: on a
          // loaded machine the worker can take seconds between the answer and the memo write.
          const recordedAt = await memoRecordedAt(databaseUrl);
          const answers = new Map<string, ChatRequest[]>();
          for (const request of model.requests) {
            if (request.answeredAt === undefined) continue;
            answers.set(keyOf(request), [...(answers.get(keyOf(request)) ?? []), request]);
          }
          let paidAgainAfterKill = 0;
          for (const [key, sent] of answers) {
            for (let i = 1; i < sent.length; i++) {
              const earlier = sent[i - 1];
              const later = sent[i];
              if (earlier === undefined || later === undefined) continue;
              const recorded = recordedAt.get(key);
              const explained =
                (recorded === undefined || recorded >= later.receivedAt) &&
                kills.some(
                  (k) => k.host === hostOf(earlier) && k.at >= earlier.receivedAt && k.at <= later.receivedAt,
                );
              if (explained) paidAgainAfterKill += 1;
              check(
                explained,
                `${key}: answered ${sent.length} times with no SIGKILL to explain answer ${i + 1} ` +
                  `(memo answer recorded ${recorded === undefined ? 'never' : `${recorded - later.receivedAt} ms after it was asked`})`,
              );
            }
          }
          for (const stall of stalls) {
            // The frozen host's call is the last one under its key: the host that took the step over waited for it.
            // Unless the frozen host, once continued, was killed before it stored the answer: then the successor
            // takes the lapsed claim and pays again, a second answer the check above holds to that kill.
            const calls = model.requests.filter((r) => keyOf(r) === stall.key && r.receivedAt >= stall.since);
            const second = calls[1];
            const killedOnceContinued =
              second !== undefined &&
              kills.some(
                (k) => k.host === stall.host && k.at >= stall.continuedAt && k.at <= second.receivedAt,
              );
            check(
              calls.length === 1 || (calls.length === 2 && killedOnceContinued),
              `${stall.key}: ${calls.length} model calls from a ${stall.ms} ms stall of ${stall.host} on`,
            );
          }
          const memoRows = await stores.memo.count();
          // Summarize and tag per version, and the agent's three turns (search, file, answer) per agent version.
          const modelSteps = submitted.length * 2 + agentVersions * AGENT_TURNS;
          check(
            memoRows === modelSteps,
            `${memoRows} memoised answers for ${modelSteps} model steps and turns`,
          );

          // Each agent turn paid once: the model server's log by turn key, `<runId>:related:turn-<n>`; a second
          // answer under one key was held to a kill above, as any step's is.
          const turnKeys = [...answers.keys()].filter((key) => /:related:turn-\d+$/.test(key));
          const turnAnswers = turnKeys.reduce((n, key) => n + (answers.get(key)?.length ?? 0), 0);
          check(
            turnKeys.length === agentVersions * AGENT_TURNS,
            `${turnKeys.length} agent turns answered for ${agentVersions * AGENT_TURNS}`,
          );
          // Each cross-reference once per agent run of a document: one effect at the receiver per version run with
          // the agent on, each under its own key `<runId>:related:call-<n>`; the receiver dedupes a retry's POST.
          const xrefEffects = xrefs.server.effects;
          const fromOf = (body: unknown): string =>
            typeof body === 'object' && body !== null && 'from' in body ? String(body.from) : '?';
          for (const documentId of versions.keys()) {
            const filed = xrefEffects.filter((e) => fromOf(e.body) === documentId);
            const expected = agentDocuments.has(documentId) ? (versions.get(documentId) ?? 0) : 0;
            check(
              filed.length === expected,
              `${documentId}: ${filed.length} cross-references filed for ${expected} agent run(s)`,
            );
            check(
              filed.every((e) => /:related:call-\d+$/.test(e.key)),
              `${documentId}: a cross-reference under a key that is not a call's: ${filed.map((e) => e.key).join(', ')}`,
            );
          }
          check(
            xrefEffects.length === agentVersions,
            `${xrefEffects.length} cross-references for ${agentVersions} agent runs`,
          );
          // Each agent run's loop answered, with its figures in the run's result.
          let loopTurns = 0;
          let loopToolCalls = 0;
          let loopMemoisedTurns = 0;
          for (const documentId of agentDocuments) {
            const result = (await client.workflow
              .getHandle(workflowIdFor(documentId))
              .result()) as PipelineResult;
            const loop = result.related?.agent;
            check(
              loop?.outcome === 'answered',
              `${documentId}: its agent loop ended ${loop?.outcome ?? 'without a result'}`,
            );
            loopTurns += loop?.turns ?? 0;
            loopToolCalls += loop?.toolCalls.length ?? 0;
            loopMemoisedTurns += loop?.memoisedTurns ?? 0;
          }

          // Each document published once per version: one effect per version, never two under one key.
          for (const [documentId, count] of versions) {
            const effects = receiver.effects.filter((e) => e.documentId === documentId);
            check(
              effects.length === count,
              `${documentId}: ${effects.length} effects for ${count} version(s)`,
            );
            check(
              new Set(effects.map((e) => e.key)).size === effects.length,
              `${documentId}: two effects under one key`,
            );
          }
          check(
            receiver.effects.length === submitted.length,
            `${receiver.effects.length} effects for ${submitted.length} versions`,
          );
          const stillOpen = await stores.ledger.openClaims();
          check(
            stillOpen.length === 0,
            `open deliveries left: ${stillOpen.map((e) => e.idempotencyKey).join(', ')}`,
          );

          const count = (kind: string): number => events.filter((e) => e.landed.startsWith(kind)).length;
          const figures = [
            `seed ${SEED}`,
            `${receiverKind}`,
            `events ${events.length}: SIGKILL ${kills.length} (${count('SIGKILL host-a right after') + count('SIGKILL host-b right after')} after a publish), SIGSTOP ${stalls.length}`,
            `dev server restarts ${serverRestarts}`,
            `worker processes ${processes.length} on 2 hosts`,
            `documents ${versions.size}, versions ${submitted.length}, effects at the receiver ${receiver.effects.length} (POSTs ${receiver.posts})`,
            `model requests ${model.requests.length}, answers sent ${[...answers.values()].flat().length} for ${answers.size} keys, ` +
              `paid again after a kill ${paidAgainAfterKill}, memo rows ${memoRows}`,
            `ledger verdicts by the operator: delivered ${verdicts.delivered}, not delivered ${verdicts.unsent}`,
            `agent runs ${agentVersions} (latest per document ${agentDocuments.size}): turns ${loopTurns} (${loopMemoisedTurns} from the memo), ` +
              `tool calls ${loopToolCalls}, cross-references at the receiver ${xrefEffects.length} (POSTs ${xrefs.server.requests.length}), ` +
              `turn answers paid ${turnAnswers} for ${turnKeys.length} turn keys`,
            `${((finishedAt - startedAt) / 1000).toFixed(0)} s`,
          ];
          log(`figures: ${figures.join('; ')}`);

          assert.deepEqual(problems, []);
          assert.equal(events.length, EVENTS.length);
          assert.equal(serverRestarts, SERVER_RESTARTS);
          assert.ok(stalls.length >= 1, 'no stall landed inside a model call');
          assert.ok(versions.size >= 6 && submitted.length > versions.size, 'too few documents, or no edit');
          assert.ok(agentVersions >= 3, 'too few agent runs');
        },
      );
    });
  }
});
