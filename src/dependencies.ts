import type { ActivityDependencies } from '../activities';
import type { Config } from './config';
import { blobTextSource } from './documents/text-source';
import { OfflineModel } from './model/offline-model';
import { OpenAICompatibleModel } from './model/openai-compatible';
import type { DocumentModel } from './model/types';
import { StorePublisher } from './publisher/store-publisher';
import type { Publisher } from './publisher/types';
import { WebhookPublisher } from './publisher/webhook-publisher';
import { openStores } from './store/open';
import type { Stores } from './store/open';

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
  /** The blob store, memo, ledger and publication database of the configured backend. */
  stores: Stores;
  /** Releases the database handles. */
  close(): Promise<void>;
}

/**
 * The composition root: the real activity dependencies from configuration. Every worker (npm start, npm run
 * worker, the demo's and the tests' worker processes) is wired here; `overrides` swaps the model or publisher.
 */
export async function createDependencies(
  config: Config,
  overrides: DependencyOverrides = {},
): Promise<Dependencies> {
  const stores = await openStores(config);
  const publisher = overrides.publisher ?? createPublisher();
  function createPublisher(): Publisher {
    if (config.publisher.kind === 'webhook') {
      return new WebhookPublisher({
        url: config.publisher.url,
        timeoutMs: config.publishRequestTimeoutMs,
        ledger: stores.ledger,
        openClaimPolicy: config.openDeliveryPolicy,
        secret: config.publishSecret,
      });
    }
    return new StorePublisher(stores.publications(), stores.backend);
  }
  return {
    deps: {
      model: overrides.model ?? createModel(config),
      publisher,
      memo: stores.memo,
      texts: blobTextSource(stores.blobs, config.maxDocumentBytes),
      prices: config.prices,
      memoLeaseMs: config.memoLeaseMs,
      maxProviderErrors: config.maxProviderErrors,
    },
    stores,
    close: () => stores.close(),
  };
}
