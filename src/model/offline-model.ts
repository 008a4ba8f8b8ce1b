import { setTimeout as sleep } from 'node:timers/promises';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { RequestThread } from '../lib/thread';
import type { OfflineAnswer, OfflineRequest } from './offline-nlp';
import type { DocumentModel, ModelAnswer, ModelCall, ModelRequest } from './types';

/**
 * The one thread of this process that scores texts for every OfflineModel in it. The scoring is ~20 ms of CPU a
 * document; on the event loop it held up every workflow task, heartbeat and commit of the worker meanwhile, where a
 * remote model leaves them be. One thread, not one per core: the steps of a document, asked together,
 * share one analysis of its text there (offline-nlp.ts keeps the last few).
 */
const scorer = new RequestThread<OfflineRequest, OfflineAnswer>(
  "the offline model's thread",
  require.resolve('./offline-thread'),
);

/**
 * The embedded default while MODEL names no provider: each step's offline answer (its definition's `offline`,
 * an extractive summary, keyword tags) computed from the text with wink-nlp, on a thread of its own. Deterministic and free; results are labelled provider "offline". An
 * optional latency stands in for a remote model's, so a demo or a chaos test can kill a worker in the middle of a
 * "call".
 */
export class OfflineModel implements DocumentModel {
  readonly info = { provider: 'offline', model: 'extractive-wink-nlp' } as const;
  /** The offline model's own code (its text analysis): a change to it asks every step again. */
  readonly promptVersion = sourceVersion([require.resolve('./offline-nlp'), require.resolve('./markdown')]);

  constructor(private readonly latencyMs = 0) {}

  /**
   * Answers with the step's own offline function (request.offline), on the scoring thread. The value is whatever
   * the step's function returns: the step checks it against its schema (runModelStep), as any model's answer.
   */
  async ask<T>(request: ModelRequest<T>, text: string, call?: ModelCall): Promise<ModelAnswer<T>> {
    await this.wait(call?.signal);
    const { module, exportName, input } = request.offline;
    const { value, usage } = await scorer.call({ module, exportName, text, input }, call?.signal);
    return { value: value as T, usage };
  }

  private async wait(signal: AbortSignal | undefined): Promise<void> {
    if (this.latencyMs === 0) return;
    await sleep(this.latencyMs, undefined, { signal });
  }
}

/** A short hash of source files' contents. */
function sourceVersion(files: readonly string[]): string {
  const hash = createHash('sha256');
  for (const file of files) hash.update(fs.readFileSync(file));
  return hash.digest('hex').slice(0, 12);
}
