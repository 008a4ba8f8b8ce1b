import { isGrpcServiceError } from '@temporalio/client';
import type { Connection } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import { REVIEW_STATUS } from '../contract/review';

/** gRPC's status code ALREADY_EXISTS. */
const GRPC_ALREADY_EXISTS = 6;

/**
 * Registers the review's search attribute (src/contract/review.ts) in `namespace`, where the server lets a client do so
 * (the time-skipping test server, a self-hosted cluster); already there, it is left as it is. The dev servers the
 * project starts are told it by a flag instead (src/temporal/tuning.ts).
 */
export async function registerReviewSearchAttribute(
  connection: Connection,
  namespace: string,
): Promise<void> {
  try {
    await connection.operatorService.addSearchAttributes({
      namespace,
      searchAttributes: {
        [REVIEW_STATUS.name]: temporal.api.enums.v1.IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
      },
    });
  } catch (err) {
    if (isGrpcServiceError(err) && err.code === GRPC_ALREADY_EXISTS) return;
    throw err;
  }
}
