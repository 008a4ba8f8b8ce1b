/**
 * The contract of the batch workflow: what a batch is (a manifest of document references in the blob store),
 * its options and the tally it keeps, as schemas; with the plain values, types and helpers of ./batch-plain.ts
 * (what it answers about its progress), re-exported here. Workers check a batch's input with these schemas (see
 * checkBatchInput); the batch workflow reads only ./batch-plain.ts, as the pipeline reads only ./plain.ts.
 */
import { z } from 'zod';
import { BATCH_SCHEMA_VERSION, MAX_LISTED_FAILURES } from './batch-plain';
import type { BatchFailure, BatchTally, BulkProgress } from './batch-plain';

type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : never) : never;
import {
  BudgetInputSchema,
  DocumentIdSchema,
  PipelineOptionsSchema,
  ReviewSettingsSchema,
  AgentSettingsSchema,
  TextRefSchema,
} from '.';

export * from './batch-plain';

/** One document of a batch: who it is, which version of its text, and where it came from (for messages). */
export const BatchEntrySchema = z
  .object({
    documentId: DocumentIdSchema,
    textRef: TextRefSchema,
    title: z.string().min(1).max(300),
    source: z.string().max(4096),
  })
  .strict();
export type BatchEntry = z.infer<typeof BatchEntrySchema>;

/** Entries per page of a big batch's manifest: what a client holds at once, however big the batch. */
export const MANIFEST_PAGE_SIZE = 1_000;

/** A page of entries, as stored in the blob store. A batch of one page is its own manifest. */
export const ManifestPageSchema = z.object({ entries: z.array(BatchEntrySchema) }).strict();

/**
 * The manifest, as stored in the blob store: its reference is the batch's content, and so its identity. Up to a
 * page of entries, the entries themselves; above, the references of its pages in order, each of `pageSize`
 * entries but the last, so that neither the client nor a worker ever holds the whole list.
 */
export const BatchManifestSchema = z.union([
  ManifestPageSchema,
  z
    .object({
      pages: z.array(TextRefSchema).min(1),
      pageSize: z.number().int().min(1),
      total: z.number().int().min(0),
    })
    .strict(),
]);
export type BatchManifest = z.infer<typeof BatchManifestSchema>;

/** Bulk mode's settings (BULK_* in docs/configuration.md). */
export const BulkSettingsSchema = z
  .object({
    /** Requests per provider batch at most (OpenAI takes 50,000 a batch, Anthropic 100,000). */
    maxRequests: z.number().int().min(1).max(50_000).default(50_000),
    /**
     * Provider batches in turn: requests a round left unanswered (an error, a refused answer, an expired batch) go
     * into the next; after the last, the documents' own steps call the model for them one by one.
     */
    rounds: z.number().int().min(1).max(5).default(2),
    /** The first look at a provider batch, this long after it is created; each next one twice as long after. */
    pollSeconds: z.number().int().min(1).max(3600).default(60),
    /** The longest wait between two looks. */
    pollMaxSeconds: z
      .number()
      .int()
      .min(1)
      .max(6 * 3600)
      .default(1800),
  })
  .strict();
export type BulkSettings = z.output<typeof BulkSettingsSchema>;

export const BatchOptionsSchema = z
  .object({
    /** Document runs open at once: the sliding window. */
    window: z.number().int().min(1).max(1000).default(16),
    /**
     * History events one run of the batch may reach before it drains its window and continues as new (Temporal
     * warns at 10,240 events and also suggests continuing by itself, which is heeded too).
     */
    historyBudget: z.number().int().min(50).max(40_000).default(4_000),
    /** Entries read from the manifest per activity call. */
    pageSize: z.number().int().min(1).max(1000).default(250),
    /** Process documents again as new runs even where this version completed before (`--rerun`). */
    rerun: z.boolean().default(false),
    /** Passed to every document's run, complete (defaults filled in), so each run takes its input as it is. */
    pipeline: PipelineOptionsSchema.default(() => PipelineOptionsSchema.parse({})),
    /** What the batch's model calls may spend together (`--budget-usd`, `--budget-tokens`); unset: no limit. */
    budget: BudgetInputSchema.optional(),
    /** Every document's draft waits for a person's review before it is published (src/contract/review.ts). */
    review: ReviewSettingsSchema.optional(),
    /** The runs' agent steps are on (AGENT=on, docs/agent.md); each run's corpus is the batch's manifest. */
    agent: AgentSettingsSchema.optional(),
    /** Bulk mode (BULK=on, docs/bulk.md): the model requests go to the provider's batch API first. */
    bulk: BulkSettingsSchema.optional(),
  })
  .strict();
export type BatchOptions = z.output<typeof BatchOptionsSchema>;

const StepCountSchema = z.object({ done: z.number().int().min(0), failed: z.number().int().min(0) });

/** What the batch has seen end, summed; carried across continue-as-new. */
export const BatchTallySchema = z.object({
  /** Documents that ended published (or superseded) by a run of this batch, or by one it attached to. */
  done: z.number().int().min(0),
  failed: z.number().int().min(0),
  /** Of `done`: answered `superseded` (a newer run of the document had published first; nothing written). */
  superseded: z.number().int().min(0),
  /** Of `done`: ended by a review that rejected the draft (or its deadline did): nothing published. */
  rejected: z.number().int().min(0).optional(),
  /** Of `done`: finished before this batch asked (the same version had completed): nothing ran again. */
  doneEarlier: z.number().int().min(0),
  /** Documents whose run of this version was already under way (another submission's): waited on, not rerun. */
  attached: z.number().int().min(0),
  /** Runs of another version of a document that this batch ended to start the new version. */
  replaced: z.number().int().min(0),
  /** By step name: the steps this batch's runs did (a document done earlier did none in this batch). */
  steps: z.record(z.string(), StepCountSchema),
  inputTokens: z.number().int().min(0),
  outputTokens: z.number().int().min(0),
  costUsd: z.number().min(0),
  /** Model answers reused from the memo rather than paid for again. */
  memoised: z.number().int().min(0),
});
// The plain type (./batch-plain.ts, for workflow code) is what the schema checks.
const tallyType: Same<z.infer<typeof BatchTallySchema>, BatchTally> = true;
void tallyType;

/** A document that failed, with why; the batch keeps the first MAX_LISTED_FAILURES and counts the rest. */
export const BatchFailureSchema = z.object({
  /** 1 for the batch's first failure, and so on: lets a follower print each failure once. */
  seq: z.number().int().min(1),
  source: z.string(),
  workflowId: z.string(),
  step: z.string().optional(),
  reason: z.string(),
});
const failureType: Same<z.infer<typeof BatchFailureSchema>, BatchFailure> = true;
void failureType;

/** What one run of the batch hands the next when it continues as new. */
export const BatchCarriedSchema = z.object({
  /** Entries before this index have ended (every one in a run that drained before continuing). */
  next: z.number().int().min(0),
  tally: BatchTallySchema,
  failures: z.array(BatchFailureSchema).max(MAX_LISTED_FAILURES),
  /** Runs of this batch so far (1 for the first). */
  runs: z.number().int().min(1),
  /** Bulk mode's provider batches, done before the first run handed out a document (BulkProgress). */
  bulk: z.custom<BulkProgress>((v) => typeof v === 'object' && v !== null).optional(),
});
export type BatchCarried = z.infer<typeof BatchCarriedSchema>;

export const BatchInputSchema = z
  .object({
    schemaVersion: z.literal(BATCH_SCHEMA_VERSION),
    manifestRef: TextRefSchema,
    total: z.number().int().min(0),
    options: BatchOptionsSchema.default(() => BatchOptionsSchema.parse({})),
    carried: BatchCarriedSchema.optional(),
  })
  .strict();
export type BatchInput = z.input<typeof BatchInputSchema>;
/** The input as the batch workflow uses it: checked, with the options' defaults filled in. */
export type CheckedBatchInput = z.output<typeof BatchInputSchema>;
