import type { ActivityDependencies } from './steps/activities';
import { AnthropicBulkApi } from './bulk/anthropic';
import { OpenAiBulkApi } from './bulk/openai';
import type { BulkApi } from './bulk/types';
import type { Config } from './config';
import { blobTextSource } from './documents/text-source';
import { AiSdkModel } from './model/ai-sdk';
import { OfflineModel } from './model/offline-model';
import type { DocumentModel } from './model/types';
import { StorePublisher } from './publisher/store-publisher';
import type { Publisher } from './publisher/types';
import { WebhookPublisher } from './publisher/webhook-publisher';
import { openStores } from './store/open';
import type { Stores } from './store/open';
import { processMetrics } from './telemetry/metrics';
import type { PipelineMetrics } from './telemetry/metrics';
import { Pacer } from './model/pacer';
import type { SqlRateLimits } from './model/rate-limit-store';
import { log } from '@temporalio/activity';

/**
 * The model chosen by the environment: a provider's when MODEL (or OPENAI_BASE_URL) names one, else offline. With
 * `rateLimits` (the store every worker shares) a provider's calls are paced for the whole fleet and kept within
 * their runs' budgets; the offline model costs nothing and is never paced.
 */
export function createModel(
  config: Config,
  rateLimits?: SqlRateLimits,
  metrics: PipelineMetrics = processMetrics().metrics,
): DocumentModel {
  if (config.model.kind === 'offline') return new OfflineModel(config.offlineModelLatencyMs);
  return new AiSdkModel(
    config.model,
    config.modelRequestTimeoutMs,
    rateLimits === undefined
      ? undefined
      : (scope, info) =>
          new Pacer(rateLimits, scope, info, {
            prices: config.prices,
            metrics,
            // A turn is kept for the longest a call may take after its start, and a minute more.
            leaseMs: config.modelRequestTimeoutMs + 60_000,
            settings: config.modelLimits,
            log,
          }),
  );
}

/** The configured provider's batch API (bulk mode): OpenAI's or Anthropic's; none for other models. */
export function createBulkApi(config: Config): BulkApi | undefined {
  const { model } = config;
  if (model.kind !== 'remote') return undefined;
  if (model.provider === 'openai') return new OpenAiBulkApi(model);
  if (model.provider === 'anthropic') return new AnthropicBulkApi(model);
  return undefined;
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
        lookupUrl: config.publishLookupUrl,
        secret: config.publishSecret,
      });
    }
    return new StorePublisher(stores.publications(), stores.backend);
  }
  const bulkApi = createBulkApi(config);
  return {
    deps: {
      model: overrides.model ?? createModel(config, stores.rateLimits),
      ...(bulkApi === undefined
        ? {}
        : { bulk: { api: bulkApi, claims: stores.bulkClaims, limits: stores.rateLimits } }),
      publisher,
      memo: stores.memo,
      blobs: stores.blobs,
      checkpoints: stores.checkpoints,
      agentToolUrl: config.agentToolUrl,
      texts: blobTextSource(stores.blobs, config.maxDocumentBytes),
      prices: config.prices,
      memoLeaseMs: config.memoLeaseMs,
      maxProviderErrors: config.maxProviderErrors,
      // Counted in this process's registry; the worker's metrics page (METRICS_PORT) serves it.
      metrics: processMetrics().metrics,
    },
    stores,
    close: () => stores.close(),
  };
}
