import { setTimeout as sleep } from 'node:timers/promises';
import type { SqlitePublicationStore } from '../src/publisher/publication-store';
import { recoveryReport } from '../src/runs/history';
import type { Submission } from '../src/runs/submit';
import type { ChatRequest } from './model-server';
import type { WorkerProcess } from './worker-process';

/**
 * Waits until the crash is set up: the first document's publication committed at the target (its answer held),
 * every other document's summary recorded and its tag call open at the model server. Returns the steps done.
 */
export async function readyForCrash(
  runs: readonly Submission[],
  store: SqlitePublicationStore,
  model: { open(): ChatRequest[] },
): Promise<number> {
  const deadline = Date.now() + 60_000;
  const [first, ...others] = runs;
  while (Date.now() < deadline) {
    const published = new Set((await store.deliveries()).map((d) => d.documentId));
    const openTags = new Set(model.open().flatMap((r) => (r.step === 'tag' ? [r.idempotencyKey] : [])));
    let done = 0;
    let summarized = 0;
    for (const r of runs) {
      const report = recoveryReport(await r.handle.fetchHistory(), 0, r.runId);
      done += report.steps.filter((s) => s.status === 'completed').length;
      if (report.steps.some((s) => s.step === 'summarize' && s.status === 'completed')) summarized += 1;
    }
    const tagsOpen = others.every((r) => openTags.has(`${r.runId}:tag`));
    if (
      first !== undefined &&
      published.has(first.document.documentId) &&
      tagsOpen &&
      summarized === runs.length
    )
      return done;
    await sleep(100);
  }
  throw new Error('the runs never reached the crash point: is worker 1 processing them?');
}

/** Until worker 1 is gone: killed by you, or by the demo when you press Enter or the window has passed. */
export async function waitForKill(worker: WorkerProcess, windowMs: number): Promise<void> {
  const stdin = process.stdin;
  const enter = new Promise<void>((resolve) => {
    if (!stdin.isTTY) return;
    stdin.once('data', () => resolve());
  });
  const timeout = sleep(windowMs, undefined, { ref: false });
  await Promise.race([worker.exited, enter, timeout]);
  if (stdin.isTTY) stdin.pause();
  await worker.kill();
}
