import type { ModelInfo, PublishResult } from '../contract';

/** What every publication carries whatever the steps are: which document, which version of it, which model. */
export interface PublicationBase {
  documentId: string;
  title: string;
  textRef: string;
  model: ModelInfo;
  /** Orders the runs of one document (see PublishInputSchema): a target refuses a late delivery from an older run. */
  scheduledAt?: number | undefined;
  /** The run whose key the delivery goes under, when it is not this one (see PublishInputSchema). */
  keyRunId?: string | undefined;
}

/** The fields of PublicationBase: every other field of a publication is a step's. */
export const PUBLICATION_BASE_FIELDS = [
  'documentId',
  'title',
  'textRef',
  'model',
  'scheduledAt',
  'keyRunId',
] as const satisfies readonly (keyof PublicationBase)[];

/**
 * What a publish target receives: the small results of the pipeline, never the whole document. The steps' own
 * fields (`summary`, `tags`, whatever a new step adds) ride at the top level beside the base, as a webhook body has
 * always carried them; a target keeps them without knowing their names (stepFieldsOf).
 */
export type Publication = PublicationBase & { readonly [field: string]: unknown };

const BASE_FIELDS: ReadonlySet<string> = new Set(PUBLICATION_BASE_FIELDS);

/** The steps' fields of a publication: every own field that is not in the base. */
export function stepFieldsOf(publication: Publication): Record<string, unknown> {
  return Object.fromEntries(Object.entries(publication).filter(([field]) => !BASE_FIELDS.has(field)));
}

/** What a target reports back; the activity adds the key and target name to make a PublishResult. */
export type Receipt = Pick<
  PublishResult,
  'documentId' | 'revision' | 'duplicate' | 'superseded' | 'receiverHonoursKey' | 'changed'
>;

/** An external system that changes something. It must dedupe by idempotency key: a key never writes twice. */
export interface Publisher {
  readonly kind: PublishResult['target'];
  publish(publication: Publication, idempotencyKey: string, signal: AbortSignal): Promise<Receipt>;
}
