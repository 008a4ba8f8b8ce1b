import type { Publisher } from '../publisher/types';
import { ApplicationFailure } from '@temporalio/activity';
import { FailureType, PublishInputSchema } from '../contract';
import type { PublishInput, PublishResult } from '../contract';
import { noMetrics } from '../telemetry/metrics';
import type { PipelineMetrics } from '../telemetry/metrics';
import { timed } from '../telemetry/phases';
import { stepInput } from './check-input';
import { withHeartbeats } from './heartbeat';
import { idempotencyKey } from './idempotency';

/**
 * The last step, the one externally visible effect: hands the results to the publish target under the step's key.
 * If the worker dies after the target committed and before Temporal recorded the step, the retry sends the same
 * key and the target answers with the first receipt instead of writing again. If a newer run of the document (a
 * reset) has already published, the target answers `superseded` instead of writing: the step succeeds with that
 * receipt, since there is nothing left to retry.
 */
export function publishActivity(deps: { publisher: Publisher; metrics?: PipelineMetrics }) {
  return async function publish(input: PublishInput): Promise<PublishResult> {
    const { keyRunId, ...publication } = stepInput(PublishInputSchema, input, 'publish input');
    // A run that continued as new while its delivery was held sends it under the first run's key.
    const key = idempotencyKey(undefined, keyRunId);
    const metrics = deps.metrics ?? noMetrics;
    const receipt = await withHeartbeats((signal) =>
      timed('publication', () => deps.publisher.publish(publication, key, signal)),
    ).catch((err: unknown) => {
      const held = err instanceof ApplicationFailure && err.type === FailureType.DeliveryHeld;
      metrics.publication(held ? 'held' : 'failed');
      throw err;
    });
    metrics.publication(receipt.superseded ? 'superseded' : receipt.duplicate ? 'duplicate' : 'published');
    // The spread keeps `superseded` when the target reported it.
    return { ...receipt, idempotencyKey: key, target: deps.publisher.kind };
  };
}
