import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import { excerpt, isRetryableStatus, postJson, transientStatusFailure } from '../lib/http';
import { FailureType } from '../contract';
import type { Publication, Publisher, Receipt } from './types';

/** What a receiver may answer; revision, duplicate and superseded are optional so any 2xx endpoint works. */
const ReceiptBodySchema = z
  .object({
    revision: z.number().int().min(1).optional(),
    duplicate: z.boolean().optional(),
    superseded: z.boolean().optional(),
  })
  .loose();

/**
 * POSTs the publication as JSON with an `Idempotency-Key` header. 2xx is success; 408, 429 and 5xx are retried
 * (honouring Retry-After); any other 4xx fails without retry and quotes the receiver's answer.
 */
export class WebhookPublisher implements Publisher {
  readonly kind = 'webhook';

  constructor(
    private readonly url: string,
    private readonly timeoutMs: number,
  ) {}

  async publish(publication: Publication, idempotencyKey: string, signal: AbortSignal): Promise<Receipt> {
    // Only the origin: webhook URLs often carry a token in the path, and messages land in histories and logs.
    const what = `publish webhook at ${new URL(this.url).origin}`;
    const answer = await postJson(this.url, publication, {
      headers: { 'idempotency-key': idempotencyKey },
      timeoutMs: this.timeoutMs,
      signal,
      what,
      transientType: FailureType.TransientPublishError,
    });
    if (answer.status >= 200 && answer.status < 300) {
      const body = ReceiptBodySchema.safeParse(safeJson(answer.body));
      // A receiver that already holds a newer run's publication says so; the receipt carries it to the result.
      const receipt: Receipt = {
        documentId: publication.documentId,
        revision: body.success ? (body.data.revision ?? 1) : 1,
        duplicate: body.success ? (body.data.duplicate ?? false) : false,
        ...(body.success && body.data.superseded === true ? { superseded: true } : {}),
      };
      return receipt;
    }
    if (isRetryableStatus(answer.status)) {
      throw transientStatusFailure(answer, what, FailureType.TransientPublishError);
    }
    throw ApplicationFailure.create({
      type: FailureType.PublishRejected,
      nonRetryable: true,
      message:
        `${what} rejected the publication of "${publication.documentId}" with HTTP ${answer.status}: ` +
        `${excerpt(answer.body)}. Retrying cannot fix a 4xx: fix the receiver or PUBLISH_WEBHOOK_URL, then rerun.`,
    });
  }
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
