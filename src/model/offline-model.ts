import { setTimeout as sleep } from 'node:timers/promises';
import { RequestThread } from '../lib/thread';
import type { OfflineAnswer, OfflineRequest } from './offline-nlp';
import type { DocumentModel, ModelAnswer, ModelCall } from './types';

/**
 * The one thread of this process that scores texts for every OfflineModel in it. The scoring is ~20 ms of CPU a
 * document; on the event loop it held up every workflow task, heartbeat and commit of the worker meanwhile, where a
 * remote model leaves them be. One thread, not one per core: summarize and tag of a document, asked together,
 * share one analysis of its text there (offline-nlp.ts keeps the last few).
 */
const scorer = new RequestThread<OfflineRequest, OfflineAnswer>(
  "the offline model's thread",
  require.resolve('./offline-thread'),
);

/**
 * The embedded default while MODEL names no provider: an extractive summary and keyword tags computed from the
 * text with wink-nlp, on a thread of its own. Deterministic and free; results are labelled provider "offline". An
 * optional latency stands in for a remote model's, so a demo or a chaos test can kill a worker in the middle of a
 * "call".
 */
export class OfflineModel implements DocumentModel {
  readonly info = { provider: 'offline', model: 'extractive-wink-nlp' } as const;
  /** offline-2: tags are always words (offline-1 could store a null tag for the word `constructor`). */
  readonly promptVersion = 'offline-2';

  constructor(private readonly latencyMs = 0) {}

  async summarize(text: string, maxSentences: number, call?: ModelCall): Promise<ModelAnswer<string>> {
    await this.wait(call?.signal);
    const { value, usage } = await scorer.call({ op: 'summarize', text, maxSentences }, call?.signal);
    if (typeof value !== 'string') throw new Error("the offline model's thread answered a summary with tags");
    return { value, usage };
  }

  async tag(text: string, maxTags: number, call?: ModelCall): Promise<ModelAnswer<string[]>> {
    await this.wait(call?.signal);
    const { value, usage } = await scorer.call({ op: 'tag', text, maxTags }, call?.signal);
    if (typeof value === 'string') throw new Error("the offline model's thread answered tags with a summary");
    return { value, usage };
  }

  private async wait(signal: AbortSignal | undefined): Promise<void> {
    if (this.latencyMs === 0) return;
    await sleep(this.latencyMs, undefined, { signal });
  }
}
