/**
 * Step 3, the one externally visible effect: the publication (the model steps' fields, as reviewed) goes to the
 * publish target under the step's idempotency key, `<runId>:publish`. The target is configured, not coded
 * (PUBLISH_WEBHOOK_URL, or the publication store: docs/deploy.md); a retry after a crash sends the same key, and
 * the target answers with its first receipt instead of publishing twice.
 */
import { definePublishStep } from '../../src';

export const publish = definePublishStep();
