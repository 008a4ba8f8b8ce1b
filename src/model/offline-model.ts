import { setTimeout as sleep } from 'node:timers/promises';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { RequestThread } from '../lib/thread';
import type { OfflineAnswer, OfflineRequest } from './offline-nlp';
import type {
  AgentModel,
  AgentReply,
  AgentTurnRequest,
  DocumentModel,
  ModelAnswer,
  ModelCall,
  ModelRequest,
  OfflinePlanner,
} from './types';

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
export class OfflineModel implements DocumentModel, AgentModel {
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

  /**
   * An agent step's turn: the step's scripted planner (its definition's `offline`) reads the conversation and
   * answers with the tools to call, or the answer tool. Tokens are estimated at four characters each, so a loop's
   * token limit means offline what it means with a provider.
   */
  async converse(request: AgentTurnRequest, call?: ModelCall): Promise<ModelAnswer<AgentReply>> {
    await this.wait(call?.signal);
    const { module, exportName, input } = request.offline;
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- the module the step's request names
    const loaded: unknown = (require(module) as Record<string, unknown>)[exportName];
    if (typeof (loaded as Partial<OfflinePlanner> | undefined)?.plan !== 'function')
      throw new Error(`${module} exports no agent step "${exportName}" with a scripted planner`);
    const value = (loaded as OfflinePlanner).plan(request.messages, input);
    const sent = request.system.length + JSON.stringify(request.messages).length;
    return {
      value,
      usage: {
        inputTokens: Math.ceil(sent / 4),
        outputTokens: Math.ceil(JSON.stringify(value).length / 4),
      },
    };
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
