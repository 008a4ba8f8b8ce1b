import path from 'node:path';
import { blobTextSource } from '../activities/document-text';
import type { ActivityDependencies } from '../activities';
import { BlobStore } from './blobs';
import type { Config } from './config';
import { AnswerMemo } from './model/memo';
import { OfflineModel } from './model/offline-model';
import { OpenAICompatibleModel } from './model/openai-compatible';
import type { DocumentModel } from './model/types';
import { PublicationStore } from './publisher/publication-store';
import { SqlitePublisher } from './publisher/sqlite-publisher';
import type { Publisher } from './publisher/types';
import { WebhookPublisher } from './publisher/webhook-publisher';

/** Files in the data folder. */
export function dataPaths(dataDir: string) {
  return {
    blobs: path.join(dataDir, 'blobs'),
    memo: path.join(dataDir, 'memo.db'),
    publications: path.join(dataDir, 'publications.db'),
    temporal: path.join(dataDir, 'temporal.db'),
  };
}

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

/** Builds the real activity dependencies from configuration; `close` releases the database handles. */
export function createDependencies(config: Config): { deps: ActivityDependencies; close(): void } {
  const files = dataPaths(config.dataDir);
  const memo = new AnswerMemo(files.memo);
  let store: PublicationStore | undefined;
  let publisher: Publisher;
  if (config.publisher.kind === 'webhook') {
    publisher = new WebhookPublisher(config.publisher.url, config.publishRequestTimeoutMs);
  } else {
    store = new PublicationStore(files.publications);
    publisher = new SqlitePublisher(store);
  }
  return {
    deps: {
      model: createModel(config),
      publisher,
      memo,
      texts: blobTextSource(new BlobStore(files.blobs), config.maxDocumentBytes),
      prices: config.prices,
    },
    close() {
      memo.close();
      store?.close();
    },
  };
}
