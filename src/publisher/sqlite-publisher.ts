import { PublicationStore } from './publication-store';
import type { Publication, Publisher, Receipt } from './types';

/** The default target: the embedded publication database in the project's data folder. */
export class SqlitePublisher implements Publisher {
  readonly kind = 'sqlite';

  constructor(readonly store: PublicationStore) {}

  publish(publication: Publication, idempotencyKey: string): Promise<Receipt> {
    return Promise.resolve(this.store.publish(publication, idempotencyKey));
  }
}
