/**
 * The contract of the workflow and its steps: each step's input and result schemas (one section per step), the
 * list of steps, the workflow's input and result, and the validation that turns bad input into a clear,
 * non-retryable failure. Workflows, activities and clients all read it. Workflow-safe: no Node builtins, no I/O;
 * it is bundled into the workflow sandbox.
 */
import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';

export const DEFAULT_TASK_QUEUE = 'document-pipeline';

/** Bumped whenever PipelineInput changes shape; older inputs are refused with a message, never guessed at. */
export const INPUT_SCHEMA_VERSION = 1;

/** Failure types that retrying cannot fix; each comes with a message telling the user what to change. */
export const FailureType = {
  InvalidInput: 'InvalidInput',
  InvalidDocument: 'InvalidDocument',
  UnsupportedSchemaVersion: 'UnsupportedSchemaVersion',
  ModelRejected: 'ModelRejected',
  ModelOutputInvalid: 'ModelOutputInvalid',
  PublishRejected: 'PublishRejected',
  TransientModelError: 'TransientModelError',
  TransientPublishError: 'TransientPublishError',
  /** A webhook delivery whose earlier attempt may have landed, waiting for an operator's verdict. */
  DeliveryHeld: 'DeliveryHeld',
  /** The payload codec refused a payload (plaintext where encryption is required, an unknown key). */
  PayloadRefused: 'PayloadRefused',
  /** A model step met more provider errors in one run than MAX_PROVIDER_ERRORS allows. */
  ProviderErrorsExhausted: 'ProviderErrorsExhausted',
} as const;

// ---------------------------------------------------------------------------------------------------------------
// Building blocks every step uses
// ---------------------------------------------------------------------------------------------------------------

export const DocumentIdSchema = z
  .string()
  .regex(
    /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/,
    'must be 1-128 characters of letters, digits, ".", "_", ":" or "-", starting with a letter or digit',
  );

export const TextRefSchema = z
  .string()
  .regex(/^sha256:[0-9a-f]{64}$/, 'must be a blob reference of the form "sha256:<64 hex digits>"');

export const UsageSchema = z.object({
  inputTokens: z.number().int().min(0),
  outputTokens: z.number().int().min(0),
});
export type Usage = z.infer<typeof UsageSchema>;

export const ModelInfoSchema = z.object({
  provider: z.enum(['offline', 'openai-compatible']),
  model: z.string(),
});
export type ModelInfo = z.infer<typeof ModelInfoSchema>;

/** What every model step's result carries besides its answer: the key, the model, the tokens and the cost. */
const ModelStepFields = {
  idempotencyKey: z.string(),
  model: ModelInfoSchema,
  usage: UsageSchema,
  /** True when the answer came from the durable memo: received by an earlier attempt, not paid for again. */
  memoised: z.boolean(),
  /**
   * Estimated price of the call in US dollars from the worker's price table; null when the model has no
   * price there. Optional so histories recorded before cost accounting still replay.
   */
  estimatedCostUsd: z.number().min(0).nullable().optional(),
  /** Tokens of paid answers this run refused (cut off, wrong shape) before the one kept; counted in the cost. */
  rejectedUsage: UsageSchema.optional(),
};

export const ModelStepFieldsSchema = z.object(ModelStepFields);
export type ModelStepFields = z.infer<typeof ModelStepFieldsSchema>;

// ---------------------------------------------------------------------------------------------------------------
// Step: summarize (a model call)
// ---------------------------------------------------------------------------------------------------------------

export const SummarizeInputSchema = z
  .object({
    documentId: DocumentIdSchema,
    textRef: TextRefSchema,
    maxSentences: z.number().int().min(1).max(20),
  })
  .strict();
export type SummarizeInput = z.infer<typeof SummarizeInputSchema>;
export const SummarizeResultSchema = z.object({ summary: z.string(), ...ModelStepFields });
export type SummarizeResult = z.infer<typeof SummarizeResultSchema>;

// ---------------------------------------------------------------------------------------------------------------
// Step: tag (a model call)
// ---------------------------------------------------------------------------------------------------------------

export const TagInputSchema = z
  .object({ documentId: DocumentIdSchema, textRef: TextRefSchema, maxTags: z.number().int().min(1).max(20) })
  .strict();
export type TagInput = z.infer<typeof TagInputSchema>;
export const TagResultSchema = z.object({ tags: z.array(z.string()), ...ModelStepFields });
export type TagResult = z.infer<typeof TagResultSchema>;

// ---------------------------------------------------------------------------------------------------------------
// Step: publish (the one external effect)
// ---------------------------------------------------------------------------------------------------------------

export const PublishInputSchema = z
  .object({
    documentId: DocumentIdSchema,
    title: z.string().min(1).max(300),
    textRef: TextRefSchema,
    summary: z.string().min(1),
    tags: z.array(z.string()),
    model: ModelInfoSchema,
    /**
     * Orders the runs of one document (epoch ms): the workflow time at which this run scheduled its publish step.
     * Every retry of the step sends the same value (it is part of the step's input), and a later run (a reset,
     * continue-as-new, a resubmission) schedules later, so the target can refuse a late delivery from an older
     * run instead of letting it overwrite a newer revision. Optional: runs scheduled before it existed send none.
     */
    scheduledAt: z.number().int().nonnegative().optional(),
  })
  .strict();
export type PublishInput = z.infer<typeof PublishInputSchema>;
export const PublishResultSchema = z.object({
  idempotencyKey: z.string(),
  target: z.enum(['sqlite', 'postgres', 'webhook']),
  documentId: z.string(),
  /** 1 for the first publication of a document; a reset (new run ID, new key) produces the next one. */
  revision: z.number().int().min(1),
  /** True when the target had already seen this key: a retry after a crash, answered with the first result. */
  duplicate: z.boolean(),
  /**
   * True when a newer run of the document had already published it: this (older) run's publication was not
   * written, and revision is the newer one's. Nothing to retry; absent on the usual path.
   */
  superseded: z.boolean().optional(),
  /** Webhook only: true when the receiver echoed the Idempotency-Key, so it is known to dedupe by it. */
  receiverHonoursKey: z.boolean().optional(),
});
export type PublishResult = z.infer<typeof PublishResultSchema>;

// ---------------------------------------------------------------------------------------------------------------
// The steps, in order
// ---------------------------------------------------------------------------------------------------------------

/**
 * The steps, in order. Each name is also the step's explicit activity ID, so idempotency keys read
 * `<runId>:<step>`; reports, progress and the result table read their step list from here.
 */
export const STEPS = ['summarize', 'tag', 'publish'] as const;
export type StepName = (typeof STEPS)[number];
/** The steps that call the model (their results carry usage and cost); publish is the effect. */
export const MODEL_STEPS = ['summarize', 'tag'] as const satisfies readonly StepName[];
export type ModelStepName = (typeof MODEL_STEPS)[number];

// ---------------------------------------------------------------------------------------------------------------
// The workflow: its input, result and progress
// ---------------------------------------------------------------------------------------------------------------

export const PipelineOptionsSchema = z
  .object({
    /** Sentences in the summary. */
    maxSummarySentences: z.number().int().min(1).max(20).default(3),
    /** Tags to keep. */
    maxTags: z.number().int().min(1).max(20).default(5),
    /** Start-to-close timeout of each model call; large documents on slow local models need more. */
    modelTimeoutSeconds: z.number().int().min(1).max(3600).default(120),
    /**
     * Overall budget of each step, every retry included (schedule-to-close). Within it a step retries without an
     * attempt cap, so crashed or stalled workers never fail a document; provider errors have their own bounded
     * count (MAX_PROVIDER_ERRORS), kept by the activity.
     */
    stepBudgetMinutes: z
      .number()
      .int()
      .min(1)
      .max(7 * 24 * 60)
      .default(60),
  })
  .strict();
export type PipelineOptions = z.infer<typeof PipelineOptionsSchema>;

export const PipelineInputSchema = z
  .object({
    schemaVersion: z.literal(INPUT_SCHEMA_VERSION),
    documentId: DocumentIdSchema,
    textRef: TextRefSchema,
    title: z.string().min(1).max(300),
    options: PipelineOptionsSchema.default(() => PipelineOptionsSchema.parse({})),
  })
  .strict();
export type PipelineInput = z.input<typeof PipelineInputSchema>;

export interface PipelineResult {
  documentId: string;
  title: string;
  summary: SummarizeResult;
  tags: TagResult;
  publication: PublishResult;
}

export const StepStateSchema = z.enum(['pending', 'running', 'done', 'failed']);
export type StepState = z.infer<typeof StepStateSchema>;
export interface PipelineProgress {
  documentId: string;
  steps: Record<StepName, StepState>;
}

/** Every step pending: the progress of a run that has just started. */
export function initialProgress(documentId: string): PipelineProgress {
  const steps = z
    .record(z.enum(STEPS), StepStateSchema)
    .parse(Object.fromEntries(STEPS.map((step) => [step, 'pending'])));
  return { documentId, steps };
}

/** The model steps' results within a workflow result, whichever steps there are: for usage and cost totals. */
export function modelStepResults(result: PipelineResult): ModelStepFields[] {
  return Object.values(result).flatMap((value) => {
    const parsed = ModelStepFieldsSchema.safeParse(value);
    return parsed.success ? [parsed.data] : [];
  });
}

/** The workflow ID for a document: the same document always maps to the same run, so a resubmission attaches. */
export function workflowIdFor(documentId: string): string {
  return `document-${documentId}`;
}

/**
 * Parses with zod and turns a failure into a non-retryable ApplicationFailure naming each bad field.
 * In workflow code a raw ZodError would fail the workflow *task* and leave the run "Running" forever.
 */
export function parseOrFail<S extends z.ZodType>(schema: S, value: unknown, what: string): z.output<S> {
  const parsed = schema.safeParse(value);
  if (parsed.success) return parsed.data;
  throw ApplicationFailure.create({
    type: FailureType.InvalidInput,
    nonRetryable: true,
    message: `Invalid ${what}: ${describeIssues(parsed.error)}`,
  });
}

/** One line per problem, each naming the field, e.g. `options.maxTags: Too big: expected number to be <=20`. */
export function describeIssues(error: z.ZodError): string {
  return error.issues
    .map((issue) => {
      const field = issue.path.length > 0 ? issue.path.join('.') : '(root)';
      if (issue.code === 'unrecognized_keys') {
        return `${field}: unknown field(s) ${issue.keys.map((k) => `"${k}"`).join(', ')}; remove them`;
      }
      return `${field}: ${issue.message}`;
    })
    .join('; ');
}

/** Inputs written by older (or newer) code get a clear refusal instead of a guess at what their fields meant. */
export function refuseOtherSchemaVersions(rawInput: unknown): void {
  if (typeof rawInput !== 'object' || rawInput === null || !('schemaVersion' in rawInput)) return;
  const version = rawInput.schemaVersion;
  if (typeof version === 'number' && version !== INPUT_SCHEMA_VERSION) {
    throw ApplicationFailure.create({
      type: FailureType.UnsupportedSchemaVersion,
      nonRetryable: true,
      message:
        `pipeline input has schemaVersion ${version}, but this worker understands only ${INPUT_SCHEMA_VERSION}; ` +
        'resubmit the document with the current client, or run a worker of the matching version',
    });
  }
}
