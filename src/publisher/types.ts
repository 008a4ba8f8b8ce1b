import type { PublishInput, PublishResult } from '../contract';

/** What a publish target receives: the small results of the pipeline, never the whole document. */
export type Publication = PublishInput;

/** What a target reports back; the activity adds the key and target name to make a PublishResult. */
export type Receipt = Pick<
  PublishResult,
  'documentId' | 'revision' | 'duplicate' | 'superseded' | 'receiverHonoursKey'
>;

/** An external system that changes something. It must dedupe by idempotency key: a key never writes twice. */
export interface Publisher {
  readonly kind: PublishResult['target'];
  publish(publication: Publication, idempotencyKey: string, signal: AbortSignal): Promise<Receipt>;
}
