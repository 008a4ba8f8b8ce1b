import type { ActivityOptions } from '@temporalio/workflow';
import { FailureType } from '../contract/plain';

/**
 * Model steps' retries fit the fault. No attempt cap: a worker that crashes or stalls times its attempts out
 * (heartbeat timeout), and that must never fail a document, however often it happens. What bounds a step is its
 * overall budget (schedule-to-close, from the input) and, for provider errors, a count the activity keeps in the
 * memo (MAX_PROVIDER_ERRORS), past which it fails the step for good with the provider's last error. A dead worker
 * is noticed by the heartbeat timeout (the activity heartbeats every 2 s), a hung call by the start-to-close
 * timeout, which the input may raise for big documents. A 429's Retry-After overrides the backoff.
 */
export const modelStepOptions: ActivityOptions = {
  startToCloseTimeout: '2 minutes',
  heartbeatTimeout: '10 seconds',
  retry: {
    initialInterval: '2 seconds',
    backoffCoefficient: 2,
    maximumInterval: '2 minutes',
    // A refused payload fails alike on every attempt; the SDK marks argument-decoding failures retryable.
    nonRetryableErrorTypes: [FailureType.PayloadRefused],
  },
};
