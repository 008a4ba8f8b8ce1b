/** The alternatives: the same model work in a loop, without durability and with a SQLite checkpoint table. */
import path from 'node:path';
import Database from 'better-sqlite3';
import { OfflineModel } from '../../src/model/offline-model';
import { loopRow, percentile, round } from './rows';
import type { Doc, Row } from './rows';
import { summarizeRequest } from '../../test/requests';
import { tagRequest } from '../../test/requests';

/** The offline model every path of the benchmark calls, with no latency of its own. */
export const model = new OfflineModel(0);
export const call = (key: string) => ({ idempotencyKey: key, signal: new AbortController().signal });

/** The model work in a loop that saves nothing but the publication: the floor every durable path pays over. */
export async function plainLoop(
  docs: readonly Doc[],
  dir: string,
): Promise<{ row: Row; workMs: Map<string, number>; msPerDoc: number; cpuMsPerDoc: number }> {
  const db = new Database(path.join(dir, 'plain.db'));
  db.pragma('journal_mode = wal');
  db.exec('CREATE TABLE publications (doc TEXT PRIMARY KEY, summary TEXT, tags TEXT)');
  const publish = db.prepare('INSERT OR REPLACE INTO publications VALUES (?, ?, ?)');
  const workMs = new Map<string, number>();
  const cpu = process.cpuUsage();
  const started = performance.now();
  for (const doc of docs) {
    const t = performance.now();
    const summary = await model.ask(summarizeRequest(3), doc.text, call(`${doc.name}:summarize`));
    const tags = await model.ask(tagRequest(5), doc.text, call(`${doc.name}:tag`));
    publish.run(doc.name, summary.value, JSON.stringify(tags.value));
    workMs.set(doc.name, performance.now() - t);
  }
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  db.close();
  const n = Math.max(1, docs.length);
  // The loop's mean time a document (one thread, so about the model's CPU: what the throughput ceiling charges per
  // document), and the process's CPU over it, which also counts V8's helper threads (garbage collection).
  return {
    row: loopRow('plain loop, no durability', [...workMs.values()], seconds),
    workMs,
    msPerDoc: (seconds * 1000) / n,
    cpuMsPerDoc: (used.user + used.system) / 1000 / n,
  };
}

/** The classic checkpoint recipe: each step's result saved in a SQLite table, and looked up before the step runs. */
export async function checkpointLoop(
  docs: readonly Doc[],
  dir: string,
  synchronous: 'FULL' | 'NORMAL',
): Promise<Row> {
  const db = new Database(path.join(dir, `checkpoint-${synchronous}.db`));
  db.pragma('journal_mode = wal');
  db.pragma(`synchronous = ${synchronous}`);
  db.exec('CREATE TABLE checkpoints (doc TEXT, step TEXT, result TEXT, PRIMARY KEY (doc, step))');
  db.exec('CREATE TABLE publications (doc TEXT PRIMARY KEY, summary TEXT, tags TEXT)');
  const done = db.prepare('SELECT result FROM checkpoints WHERE doc = ? AND step = ?');
  const record = db.prepare('INSERT INTO checkpoints VALUES (?, ?, ?)');
  const publish = db.prepare('INSERT OR REPLACE INTO publications VALUES (?, ?, ?)');
  // The checkpoint's own cost per step, timed around its two statements: the difference of two loops' totals
  // is lost in the noise of the model work.
  const checkpointMs: number[] = [];
  const step = async <T>(doc: string, name: string, run: () => Promise<T>): Promise<T> => {
    let t = performance.now();
    const found = done.get(doc, name) as { result: string } | undefined;
    if (found !== undefined) return JSON.parse(found.result) as T;
    let spent = performance.now() - t;
    const result = await run();
    t = performance.now();
    record.run(doc, name, JSON.stringify(result));
    spent += performance.now() - t;
    checkpointMs.push(spent);
    return result;
  };
  const perDoc: number[] = [];
  const started = performance.now();
  for (const doc of docs) {
    const t = performance.now();
    const summary = await step(doc.name, 'summarize', () =>
      model.ask(summarizeRequest(3), doc.text, call('s')),
    );
    const tags = await step(doc.name, 'tag', () => model.ask(tagRequest(5), doc.text, call('t')));
    await step(doc.name, 'publish', async () => {
      publish.run(doc.name, summary.value, JSON.stringify(tags.value));
      return true;
    });
    perDoc.push(performance.now() - t);
  }
  const seconds = (performance.now() - started) / 1000;
  db.close();
  return {
    ...loopRow(`SQLite checkpoint loop (synchronous=${synchronous})`, perDoc, seconds),
    perStepOverheadMsP50: round(percentile(checkpointMs, 50), 3),
    perStepOverheadMsP95: round(percentile(checkpointMs, 95), 3),
  };
}
