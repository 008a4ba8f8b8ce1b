import type { PublicationStore } from './publication-store';
import type { Publication, Publisher, Receipt } from './types';

/**
 * The built-in target: the publication database of the configured backend (the embedded SQLite file, or
 * PostgreSQL). The key is written in the same transaction as the revision, so it needs no ledger in front.
 */
export class StorePublisher implements Publisher {
  constructor(
    readonly store: PublicationStore,
    readonly kind: 'sqlite' | 'postgres',
  ) {}

  publish(publication: Publication, idempotencyKey: string): Promise<Receipt> {
    return this.store.publish(publication, idempotencyKey);
  }
}
