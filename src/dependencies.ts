import type { ActivityDependencies } from '../activities';
import type { Config } from './config';
import { BlobStore } from './documents/blobs';
import { blobTextSource } from './documents/text-source';
import { AnswerMemo } from './model/memo';
import { OfflineModel } from './model/offline-model';
import { OpenAICompatibleModel } from './model/openai-compatible';
import type { DocumentModel } from './model/types';
import { PublicationStore } from './publisher/publication-store';
import { SqlitePublisher } from './publisher/sqlite-publisher';
import type { Publisher } from './publisher/types';
import { WebhookPublisher } from './publisher/webhook-publisher';

/** The model chosen by the environment: OpenAI-compatible when OPENAI_BASE_URL is set, else the offline one. */
export function createModel(config: Config): DocumentModel {
  if (config.model.kind === 'offline') return new OfflineModel(config.offlineModelLatencyMs);
  return new OpenAICompatibleModel({
    baseUrl: config.model.baseUrl,
    model: config.model.model,
    apiKey: config.model.apiKey,
    requestTimeoutMs: config.modelRequestTimeoutMs,
  });
}

/** Parts a caller may swap for its own (a test's scripted model, a publisher that crashes on purpose). */
export type DependencyOverrides = Partial<Pick<ActivityDependencies, 'model' | 'publisher'>>;

export interface Dependencies {
  /** What the activities get. */
  deps: ActivityDependencies;
  blobs: BlobStore;
  memo: AnswerMemo;
  /** The SQLite publish target, when the publisher writes there (no webhook, no override). */
  publications: PublicationStore | undefined;
  /** Releases the database handles. */
  close(): void;
}

/**
 * The composition root: the real activity dependencies from configuration. Every worker (npm start, npm run
 * worker, the demo's and the tests' worker processes) is wired here; `overrides` swaps the model or publisher.
 */
export function createDependencies(config: Config, overrides: DependencyOverrides = {}): Dependencies {
  const files = config.paths;
  const blobs = new BlobStore(files.blobs);
  const memo = new AnswerMemo(files.memo);
  let publications: PublicationStore | undefined;
  const publisher = overrides.publisher ?? createPublisher();
  function createPublisher(): Publisher {
    if (config.publisher.kind === 'webhook')
      return new WebhookPublisher(config.publisher.url, config.publishRequestTimeoutMs);
    publications = new PublicationStore(files.publications);
    return new SqlitePublisher(publications);
  }
  return {
    deps: {
      model: overrides.model ?? createModel(config),
      publisher,
      memo,
      texts: blobTextSource(blobs, config.maxDocumentBytes),
      prices: config.prices,
    },
    blobs,
    memo,
    publications,
    close() {
      memo.close();
      publications?.close();
    },
  };
}
