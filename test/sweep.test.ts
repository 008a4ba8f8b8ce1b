/**
 * `npm run sweep`: retention on a real dev server (`temporal server start-dev`), with both backends. Each scenario
 * stores memo entries, ledger rows and blobs for a closed run and for an open one (a run on a task queue no
 * worker polls, so it stays Running), then sweeps: the closed run's go, the open run's stay. Payloads are
 * encrypted, so the open run's input can only be read through the codec, as the command reads it.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Client } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig } from '../src/config';
import { BATCH_SCHEMA_VERSION } from '../src/contract/batch';
import { INPUT_SCHEMA_VERSION, workflowIdFor } from '../src/contract';
import type { PipelineInput } from '../src/contract';
import { memoKeyFor, memoRequestHash } from '../src/model/memo';
import type { MemoRequest } from '../src/model/memo';
import { findOpenRuns, InvalidDurationError, parseDuration, sweepUnreferenced } from '../src/runs/retention';
import type { RunMemo } from '../src/runs/latest-run';
import { openStores } from '../src/store/open';
import type { Stores } from '../src/store/open';
import { generateKey } from '../src/temporal/codec';
import { connectClient } from '../src/temporal/connection';
import { devServerEnv } from './helpers';
import { cleanupAfterAll, freePort, scratchDir } from './scratch';
import { freshDatabase } from './postgres';

const defer = cleanupAfterAll();
const SWEEP_CLI = path.join(__dirname, '..', 'src', 'cli', 'sweep.ts');
const ENCRYPTION_KEY = generateKey();

let server: TestWorkflowEnvironment;
/** A client of the dev server with the encryption key, as the submitter and the sweep both have it. */
let client: Client;

before(async () => {
  server = await devServerEnv();
  defer(() => server.teardown());
  const connected = await connectClient(loadConfig(temporalEnv()));
  defer(() => connected.close());
  client = connected.client;
});

/** The environment that points the command (and loadConfig) at the dev server, payloads encrypted. */
function temporalEnv(): Record<string, string> {
  return {
    TEMPORAL_ADDRESS: server.address,
    PAYLOAD_ENCRYPTION_KEY: ENCRYPTION_KEY,
    PAYLOAD_DECRYPTION_KEYS: '',
    PAYLOAD_REQUIRE_ENCRYPTION: '',
  };
}

/** A scratch data folder for the SQLite backend (DATABASE_URL unset even if the shell sets it). */
function sqliteEnv(): { DATA_DIR: string; DATABASE_URL: string } {
  return { DATA_DIR: scratchDir(defer, 'sweep-'), DATABASE_URL: '' };
}

const BACKENDS = [
  { name: 'SQLite', env: () => Promise.resolve(sqliteEnv()) },
  {
    name: 'PostgreSQL',
    env: async () => ({ DATA_DIR: scratchDir(defer, 'sweep-'), DATABASE_URL: await freshDatabase(defer) }),
  },
];

/** Empty stores of the backend `env` names, closed after the file's tests (before the database is dropped). */
async function storesFor(env: Record<string, string>): Promise<Stores> {
  const stores = await openStores(loadConfig({ ...temporalEnv(), ...env }));
  defer(() => stores.close());
  return stores;
}

/** What one run left in the stores: a blob, an answered memo entry and a settled ledger row. */
interface SeededRun {
  workflowId: string;
  documentId: string;
  blobRef: string;
  memoRequest: MemoRequest;
  settledKey: string;
}

/**
 * Starts a pipeline run on a task queue no worker polls, with its text stored as a blob, and writes the memo
 * entry and the settled delivery its steps would have written. A `closed` run is then terminated.
 */
async function seedRun(stores: Stores, kind: 'open' | 'closed'): Promise<SeededRun> {
  const documentId = `${kind}-${randomUUID()}`;
  const workflowId = workflowIdFor(documentId);
  const blobRef = await stores.blobs.put(Buffer.from(`The text of ${documentId}.`, 'utf8'));
  const input: PipelineInput = {
    schemaVersion: INPUT_SCHEMA_VERSION,
    documentId,
    textRef: blobRef,
    title: documentId,
  };
  const handle = await client.workflow.start('documentPipeline', {
    taskQueue: `nobody-polls-${randomUUID()}`,
    workflowId,
    args: [input],
  });
  const runId = handle.firstExecutionRunId;
  const requestHash = memoRequestHash({
    step: 'summarize',
    input,
    identity: 'test',
  });
  const memoRequest = {
    memoKey: memoKeyFor(workflowId, 'summarize', requestHash),
    workflowId,
    runId,
    step: 'summarize',
    requestHash,
  };
  assert.equal((await stores.memo.claim(memoRequest, 'seed', 30_000)).kind, 'owned');
  await stores.memo.complete(memoRequest.memoKey, {
    value: 'A summary.',
    usage: { inputTokens: 10, outputTokens: 3 },
    model: { provider: 'offline', model: 'test-model' },
  });
  const settledKey = `${runId}:publish`;
  assert.equal(
    (
      await stores.ledger.claim(
        { idempotencyKey: settledKey, workflowId, documentId, version: 'v1', inFlightMs: 0 },
        'seed',
      )
    ).kind,
    'fresh',
  );
  await stores.ledger.delivered(
    settledKey,
    'seed',
    { documentId, revision: 1, duplicate: false },
    'http://127.0.0.1:1',
  );
  if (kind === 'closed') await handle.terminate('closed for the sweep test');
  await untilListed(workflowId, kind === 'open');
  return { workflowId, documentId, blobRef, memoRequest, settledKey };
}

/** Waits until visibility (which trails the run's own state a little) lists the run as open, or no longer. */
async function untilListed(workflowId: string, open: boolean): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const { count } = await client.workflow.count(
      `WorkflowId = '${workflowId}' AND ExecutionStatus = 'Running'`,
    );
    if ((count === 1) === open) return;
    if (Date.now() > deadline)
      throw new Error(`visibility never listed ${workflowId} as ${open ? 'open' : 'closed'}`);
    await sleep(100);
  }
}

/** The closed run, the open one, an open ledger claim of the closed run, and a blob no run ever read. */
async function seedScenario(stores: Stores) {
  const closed = await seedRun(stores, 'closed');
  const open = await seedRun(stores, 'open');
  // A POST of the closed run that nobody knows the fate of: an operator's to reconcile, never swept.
  const openClaimKey = `${closed.memoRequest.runId}:publish-unanswered`;
  await stores.ledger.claim(
    {
      idempotencyKey: openClaimKey,
      workflowId: closed.workflowId,
      documentId: closed.documentId,
      version: 'v2',
      inFlightMs: 0,
    },
    'seed',
  );
  const orphanRef = await stores.blobs.put(Buffer.from(`Nobody reads this ${randomUUID()}.`, 'utf8'));
  return { closed, open, openClaimKey, orphanRef };
}

/** What of a seeded run is still in the stores. Looking claims the run's keys again, so look once, at the end. */
async function remaining(stores: Stores, run: SeededRun) {
  const memo = await stores.memo.claim(run.memoRequest, 'look', 1);
  const ledger = await stores.ledger.claim(
    {
      idempotencyKey: run.settledKey,
      workflowId: run.workflowId,
      documentId: run.documentId,
      version: 'v1',
      inFlightMs: 0,
    },
    'look',
  );
  return {
    blob: (await stores.blobs.get(run.blobRef)) !== undefined,
    memo: memo.kind === 'answered',
    ledger: ledger.kind === 'delivered',
  };
}

/** Runs `npm run sweep`'s entry point in a child process with `env` over this process's environment. */
function runSweepCli(
  args: string[],
  env: Record<string, string>,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', SWEEP_CLI, ...args], {
    env: { ...process.env, OPENAI_BASE_URL: '', OPENAI_MODEL: '', OPENAI_API_KEY: '', ...env },
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('retention periods (--older-than)', () => {
  it('reads days, hours, minutes and seconds, alone or combined largest first', () => {
    assert.equal(parseDuration('30d'), 30 * 86_400_000);
    assert.equal(parseDuration('12h'), 12 * 3_600_000);
    assert.equal(parseDuration('90m'), 90 * 60_000);
    assert.equal(parseDuration('45s'), 45_000);
    assert.equal(parseDuration('1d12h'), 36 * 3_600_000);
    assert.equal(parseDuration('2h30m15s'), 9_015_000);
  });

  it('refuses anything else, zero and a missing value, saying the accepted form', () => {
    for (const text of [
      undefined,
      '',
      '7',
      '7 days',
      '1w',
      '-1d',
      '1.5h',
      '1h1d',
      'd',
      '0s',
      '0d0h',
      '99999999d',
    ]) {
      assert.throws(
        () => parseDuration(text),
        (err: unknown) =>
          err instanceof InvalidDurationError &&
          /e\.g\. 30d, 12h, 90m, 45s or 1d12h|positive|100 years/.test(err.message),
        `accepted ${String(text)}`,
      );
    }
  });
});

describe('npm run sweep on a real dev server', () => {
  for (const backend of BACKENDS) {
    describe(backend.name, () => {
      it("removes a closed run's memo entries, settled ledger rows and blob; keeps an open run's, open claims and recent blobs", async () => {
        const stores = await storesFor(await backend.env());
        const { closed, open, openClaimKey, orphanRef } = await seedScenario(stores);
        await sleep(20);
        const cutoff = new Date();
        await sleep(20);
        const recentRef = await stores.blobs.put(
          Buffer.from(`Stored after the cutoff ${randomUUID()}.`, 'utf8'),
        );

        const openRuns = await findOpenRuns(client, stores.blobs);
        const removed = await sweepUnreferenced(stores, openRuns, cutoff);

        assert.ok(openRuns.workflowIds.has(open.workflowId));
        assert.ok(!openRuns.workflowIds.has(closed.workflowId));
        assert.ok(
          openRuns.blobRefs.has(open.blobRef),
          'the open run input, read through the codec, names its blob',
        );
        assert.deepEqual(removed, { memo: 1, ledger: 1, blobs: 2 });
        assert.deepEqual(
          (await stores.ledger.openClaims()).map((entry) => entry.idempotencyKey),
          [openClaimKey],
        );
        assert.deepEqual(await remaining(stores, closed), { blob: false, memo: false, ledger: false });
        assert.deepEqual(await remaining(stores, open), { blob: true, memo: true, ledger: true });
        assert.equal(await stores.blobs.get(orphanRef), undefined);
        assert.notEqual(await stores.blobs.get(recentRef), undefined);
      });

      it('prints what it removed and where, from the command line', async () => {
        const env = await backend.env();
        const stores = await storesFor(env);
        const { closed, open } = await seedScenario(stores);
        await sleep(1_100);

        const { code, stdout, stderr } = await runSweepCli(['--older-than', '1s'], {
          ...temporalEnv(),
          ...env,
        });

        assert.equal(code, 0, stderr);
        const where = backend.name === 'PostgreSQL' ? 'in PostgreSQL' : `in ${env.DATA_DIR}`;
        assert.match(
          stdout,
          new RegExp(
            `^Removed 1 memo entry, 1 ledger row, 2 blobs older than 1s ${escape(where)} ` +
              '\\(kept those of \\d+ open runs?\\)\\.$',
            'm',
          ),
        );
        assert.deepEqual(await remaining(stores, closed), { blob: false, memo: false, ledger: false });
        assert.deepEqual(await remaining(stores, open), { blob: true, memo: true, ledger: true });
      });
    });
  }

  it("takes an open run's blob from its memo's version when the submitter recorded one", async () => {
    const documentId = `versioned-${randomUUID()}`;
    const workflowId = workflowIdFor(documentId);
    const inInput = `sha256:${'a'.repeat(64)}`;
    const inMemo = `sha256:${'b'.repeat(64)}`;
    const input: PipelineInput = {
      schemaVersion: INPUT_SCHEMA_VERSION,
      documentId,
      textRef: inInput,
      title: documentId,
    };
    await client.workflow.start('documentPipeline', {
      taskQueue: `nobody-polls-${randomUUID()}`,
      workflowId,
      args: [input],
      memo: { version: inMemo } satisfies RunMemo,
    });
    await untilListed(workflowId, true);
    const stores = await storesFor(sqliteEnv());

    const openRuns = await findOpenRuns(client, stores.blobs);

    assert.ok(openRuns.blobRefs.has(inMemo));
  });

  it("keeps an open batch's manifest, its pages and the texts of documents it has not started yet", async () => {
    const stores = await storesFor(sqliteEnv());
    const texts = await Promise.all(
      [0, 1, 2, 3, 4].map((i) => stores.blobs.put(Buffer.from(`Text ${i} of ${randomUUID()}.`, 'utf8'))),
    );
    const entries = texts.map((textRef, i) => ({
      documentId: `batch-doc-${i}-${randomUUID()}`,
      textRef,
      title: `Document ${i}`,
      source: `doc-${i}.md`,
    }));
    const pages = [
      await stores.blobs.put(Buffer.from(JSON.stringify({ entries: entries.slice(0, 3) }))),
      await stores.blobs.put(Buffer.from(JSON.stringify({ entries: entries.slice(3) }))),
    ];
    const manifestRef = await stores.blobs.put(Buffer.from(JSON.stringify({ pages, pageSize: 3, total: 5 })));
    const batchId = `batch-open-${randomUUID()}`;
    // A batch no worker takes up: none of its documents has a run, so only the batch says what it needs.
    await client.workflow.start('batch', {
      taskQueue: `nobody-polls-${randomUUID()}`,
      workflowId: batchId,
      args: [{ schemaVersion: BATCH_SCHEMA_VERSION, manifestRef, total: 5, options: {} }],
    });
    await untilListed(batchId, true);
    await sleep(20);

    const openRuns = await findOpenRuns(client, stores.blobs);
    const removed = await sweepUnreferenced(stores, openRuns, new Date());

    assert.ok(openRuns.workflowIds.has(batchId));
    for (const ref of [manifestRef, ...pages, ...texts])
      assert.notEqual(await stores.blobs.get(ref), undefined, `${ref} was swept under an open batch`);
    assert.equal(removed.blobs, 0);
    // The same batch seen from another store (another data folder on this server) needs nothing there.
    const other = await storesFor(sqliteEnv());
    const fromOther = await findOpenRuns(client, other.blobs);
    assert.ok(!fromOther.blobRefs.has(texts[0] ?? ''));
    await client.workflow.getHandle(batchId).terminate('test over');
  });

  it('refuses to list open runs whose input it cannot decrypt, rather than guess they need nothing', async () => {
    const stores = await storesFor(sqliteEnv());
    await seedRun(stores, 'open');
    const withoutKey = await connectClient(loadConfig({ TEMPORAL_ADDRESS: server.address }));
    defer(() => withoutKey.close());

    await assert.rejects(
      findOpenRuns(withoutKey.client, stores.blobs),
      /cannot read the input of document-open-.*Unknown encoding: binary\/encrypted.*PAYLOAD_ENCRYPTION_KEY/,
    );
  });

  it('removes nothing on --dry-run, and says which open runs it would spare', async () => {
    const env = sqliteEnv();
    const stores = await storesFor(env);
    const { closed, open } = await seedScenario(stores);
    await sleep(1_100);

    const { code, stdout, stderr } = await runSweepCli(['--older-than', '1s', '--dry-run'], {
      ...temporalEnv(),
      ...env,
    });

    assert.equal(code, 0, stderr);
    assert.match(
      stdout,
      new RegExp(`^Dry run, nothing removed: .* in ${escape(env.DATA_DIR)}, keeping those of`),
    );
    // The newest open runs are named first, and this test's is the newest.
    assert.ok(stdout.includes(open.workflowId), stdout);
    assert.deepEqual(await remaining(stores, closed), { blob: true, memo: true, ledger: true });
  });
});

describe('npm run sweep refusals', () => {
  it('refuses a bad duration with the accepted form, exit code 2', async () => {
    for (const args of [['--older-than', '1w'], ['--older-than'], ['--older-than', '0s'], []]) {
      const { code, stderr } = await runSweepCli(args, { TEMPORAL_ADDRESS: '127.0.0.1:1' });
      assert.equal(code, 2, `exit code for ${args.join(' ')}`);
      // The first line is the refusal itself; the usage text (which also shows the form) follows it.
      const [refusal = ''] = stderr.split('\n');
      assert.match(refusal, /^--older-than .*(e\.g\. 30d, 12h, 90m, 45s or 1d12h|give a positive duration)/);
      assert.match(stderr, /Usage: npm run sweep -- --older-than <duration>/);
    }
  });

  it('refuses to sweep when Temporal cannot be reached: exit code 1, nothing removed', async () => {
    const env = sqliteEnv();
    const stores = await storesFor(env);
    const orphanRef = await stores.blobs.put(Buffer.from(`Nobody reads this ${randomUUID()}.`, 'utf8'));
    await sleep(1_100);
    const address = `127.0.0.1:${await freePort()}`;

    const { code, stdout, stderr } = await runSweepCli(['--older-than', '1s'], {
      ...env,
      TEMPORAL_ADDRESS: address,
    });

    assert.equal(code, 1, stdout);
    assert.match(
      stderr,
      new RegExp(`Cannot reach a Temporal server at ${escape(address)} \\(nothing answered in time\\)\\.`),
    );
    assert.match(stderr, /Nothing was removed/);
    assert.match(stderr, /Start it with npm run server .*or set TEMPORAL_ADDRESS/);
    assert.notEqual(await stores.blobs.get(orphanRef), undefined);
  });
});

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
