import { DefaultFailureConverter } from '@temporalio/common';

/**
 * Loaded by path (it also runs inside the workflow sandbox): failure messages and stack traces go into an
 * encoded attributes payload, so the payload codec encrypts them like any other payload.
 */
export const failureConverter = new DefaultFailureConverter({ encodeCommonAttributes: true });
