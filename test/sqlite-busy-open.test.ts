/**
 * A store's SQLite file whose write lock another process holds as the store opens it (a second worker mid-commit,
 * an operator's sqlite3 shell left in a transaction): the open waits the lock out without blocking the event loop,
 * and an open that gave up is tried again by the next call, so the store works once the lock is gone, without a
 * restart of the process.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { describe, it } from 'node:test';
import { SqlDeliveryLedger } from '../src/publisher/ledger-store';
import { MIGRATIONS } from '../src/store/migrations';
import { openSqlite } from '../src/store/sql-sqlite';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
const REPOSITORY = path.resolve(__dirname, '..');
/** How long the other process holds the lock. */
const HOLD_MS = 3_000;
/** The longest the event loop may stall while the store waits for the lock. */
const MAX_STALL_MS = 500;

/**
 * Another process that opens `file`, takes its write lock (BEGIN IMMEDIATE), says `locked`, and ends the
 * transaction and itself `holdMs` later. It dies with this process (its stdin closes) and after the file's tests.
 */
async function lockHolder(file: string, holdMs: number): Promise<{ pid: number; exited: Promise<void> }> {
  const script = `
    const Database = require('better-sqlite3');
    const db = new Database(process.argv[1]);
    db.exec('BEGIN IMMEDIATE');
    console.log('locked');
    process.stdin.on('end', () => process.exit(1));
    process.stdin.resume();
    setTimeout(() => { db.exec('COMMIT'); db.close(); process.exit(0); }, Number(process.argv[2]));
  `;
  const child = spawn(process.execPath, ['-e', script, file, String(holdMs)], {
    cwd: REPOSITORY,
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  defer(async () => {
    child.kill('SIGKILL');
    await exited;
  });
  const lines = createInterface({ input: child.stdout });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error('the lock holder did not take the lock within 10 s')),
      10_000,
    );
    lines.on('line', (line) => {
      if (line !== 'locked') return;
      clearTimeout(timer);
      resolve();
    });
    child.once('exit', (code) =>
      reject(new Error(`the lock holder exited (${code}) before it took the lock`)),
    );
  });
  assert.ok(child.pid !== undefined);
  return { pid: child.pid, exited };
}

/** Measures the longest gap between ticks of a 20 ms timer while `work` runs: how long the event loop stalled. */
async function longestStall<T>(work: () => Promise<T>): Promise<{ result: T; stallMs: number }> {
  let last = performance.now();
  let stallMs = 0;
  const ticker = setInterval(() => {
    const now = performance.now();
    stallMs = Math.max(stallMs, now - last - 20);
    last = now;
  }, 20);
  try {
    const result = await work();
    return { result, stallMs: Math.max(stallMs, performance.now() - last - 20) };
  } finally {
    clearInterval(ticker);
  }
}

/** A ledger file made and brought up to date as a worker leaves it, then closed. */
async function existingLedgerFile(): Promise<string> {
  const file = path.join(scratchDir(defer, 'sqlite-busy-test-'), 'ledger.db');
  const ledger = new SqlDeliveryLedger(openSqlite(file, 'ledger'));
  await ledger.openClaims();
  await ledger.close();
  return file;
}

function delivery(): Parameters<SqlDeliveryLedger['claim']>[0] {
  return {
    idempotencyKey: 'run-1:publish',
    workflowId: 'wf',
    documentId: 'doc',
    version: 'v1',
    inFlightMs: 0,
  };
}

describe("a SQLite store opened while another process holds the file's write lock", () => {
  it('waits for the lock without stalling the event loop, then works', async () => {
    const file = await existingLedgerFile();
    await lockHolder(file, HOLD_MS);
    const ledger = new SqlDeliveryLedger(openSqlite(file, 'ledger'));
    defer(() => ledger.close());

    const started = Date.now();
    const { result, stallMs } = await longestStall(() => ledger.claim(delivery(), 'owner-1'));

    assert.deepEqual(result, { kind: 'fresh' });
    assert.ok(Date.now() - started >= HOLD_MS - 1_000, 'the claim did not wait for the lock');
    assert.ok(stallMs < MAX_STALL_MS, `the event loop stalled ${Math.round(stallMs)} ms`);
  });

  it('fails the first call when the lock outlasts its wait, naming the holder, and opens on the next call', async () => {
    const file = await existingLedgerFile();
    const holder = await lockHolder(file, HOLD_MS);
    const ledger = new SqlDeliveryLedger(openSqlite(file, 'ledger', MIGRATIONS, 1_000));
    defer(() => ledger.close());

    const { result: failure, stallMs } = await longestStall(() =>
      ledger.openClaims().then(
        () => undefined,
        (err: unknown) => err,
      ),
    );

    assert.ok(failure instanceof Error, 'the first call did not fail while the lock was held');
    assert.match(
      failure.message,
      new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}.*stayed locked.*pid ${holder.pid}`),
    );
    assert.ok(stallMs < MAX_STALL_MS, `the event loop stalled ${Math.round(stallMs)} ms`);

    await Promise.race([
      holder.exited,
      new Promise((_, reject) =>
        setTimeout(() => reject(new Error('the lock holder did not end')), 10_000).unref(),
      ),
    ]);
    assert.deepEqual(await ledger.claim(delivery(), 'owner-1'), { kind: 'fresh' });
  });
});
