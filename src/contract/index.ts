/**
 * The contract of the workflow and its steps: each step's input and result schemas (one section per step), the
 * workflow's input and result, and the validation that turns bad input into a clear, non-retryable failure; with
 * the names and constants of src/contract/plain.ts, re-exported here. Activities and clients read it; a run evaluates
 * it only for an input that is not complete (src/workflow/checks.ts), so most runs never build these schemas in the
 * sandbox. No Node builtins, no I/O.
 */
import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import {
  AGENT_LIMITS,
  AGENT_OUTCOMES,
  BUDGET_ID,
  DOCUMENT_ID,
  FailureType,
  INPUT_SCHEMA_VERSION,
  OPTION_LIMITS,
  STEP_STATES,
  TEXT_REF,
  TITLE_LENGTH,
} from './plain';
import type {
  CompletePipelineInput,
  JsonValue,
  ModelInfo,
  ModelStepFields,
  OptionName,
  PipelineResult,
  PublishResult,
  Usage,
} from './plain';
import { MAX_REVIEW_MINUTES, REVIEW_POLICIES } from './review';
import { canonicalJson } from '../lib/canonical-json';

export * from './plain';

// ---------------------------------------------------------------------------------------------------------------
// Building blocks every step uses
// ---------------------------------------------------------------------------------------------------------------

export const DocumentIdSchema = z
  .string()
  .regex(
    DOCUMENT_ID,
    'must be 1-128 characters of letters, digits, ".", "_", ":" or "-", starting with a letter or digit',
  );

export const TextRefSchema = z
  .string()
  .regex(TEXT_REF, 'must be a blob reference of the form "sha256:<64 hex digits>"');

export const UsageSchema = z.object({
  /** All input tokens of the call, those served from or written to the provider's prompt cache included. */
  inputTokens: z.number().int().min(0),
  outputTokens: z.number().int().min(0),
  /**
   * Of inputTokens, those read from the provider's prompt cache (OpenAI's `cached_tokens`, Anthropic's
   * `cache_read_input_tokens`), priced lower. Absent when none, and in histories recorded before it.
   */
  cachedInputTokens: z.number().int().min(0).optional(),
  /** Of inputTokens, those written to the prompt cache (Anthropic's `cache_creation_input_tokens`), priced higher. */
  cacheWriteInputTokens: z.number().int().min(0).optional(),
});

export const ModelInfoSchema = z.object({
  /** `offline`, or the provider part of MODEL (`openai`, `anthropic`, ...): a provider is one file in src/model/. */
  provider: z.string().min(1),
  model: z.string(),
});

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
  /**
   * The answer was bought as a line of a provider batch (bulk mode, docs/bulk.md), at the batch price: the claim of
   * that batch, and what the same answers would have cost one call each (null without a price).
   */
  bulk: z.object({ claim: z.string(), listCostUsd: z.number().min(0).nullable() }).optional(),
  /** The step's identity when it was asked (src/steps/identity.ts); absent in results recorded before it. */
  identity: z.string().optional(),
  /**
   * The step was asked again because it changed: the identity under which the memo held this document's earlier
   * answer. Absent when the answer was reused, or the step had not answered this document before.
   */
  changedFrom: z.string().optional(),
  /** An agent step's loop: how it ended, its turns and tool calls (src/contract/agent.ts). */
  agent: z
    .object({
      outcome: z.enum(AGENT_OUTCOMES),
      turns: z.number().int().min(0),
      toolCalls: z.array(
        z.object({
          n: z.number().int().min(1),
          tool: z.string(),
          outcome: z.enum(['ok', 'error']),
          ref: z.string(),
        }),
      ),
      continuedAsNew: z.number().int().min(0),
      memoisedTurns: z.number().int().min(0),
    })
    .optional(),
};

export const ModelStepFieldsSchema = z.object(ModelStepFields);

// ---------------------------------------------------------------------------------------------------------------
// What every step's input may carry; each step's own input and result are in its folder (activities/<step>/)
// ---------------------------------------------------------------------------------------------------------------

/** A run's agent steps, on, within these limits (see AgentSettings). */
export const AgentSettingsSchema = z
  .object({
    maxTurns: z.number().int().min(AGENT_LIMITS.maxTurns.min).max(AGENT_LIMITS.maxTurns.max),
    maxTokens: z.number().int().min(AGENT_LIMITS.maxTokens.min).max(AGENT_LIMITS.maxTokens.max),
    maxCostUsd: z.number().positive().finite().optional(),
    historyEvents: z.number().int().min(AGENT_LIMITS.historyEvents.min).max(AGENT_LIMITS.historyEvents.max),
    corpusRef: TextRefSchema.optional(),
  })
  .strict();

/** A run's budget (see BudgetInput): a measure left out is not limited. */
export const BudgetInputSchema = z
  .object({
    id: z
      .string()
      .regex(
        BUDGET_ID,
        'must be 1-200 characters of letters, digits, ".", "_", ":" or "-", starting with one of the first two',
      ),
    tokens: z.number().int().positive().optional(),
    usd: z.number().positive().finite().optional(),
  })
  .strict();

// ---------------------------------------------------------------------------------------------------------------
// Step: publish (the one external effect)
// ---------------------------------------------------------------------------------------------------------------

export const JsonValueSchema: z.ZodType<JsonValue> = z.lazy(() =>
  z.union([
    z.string(),
    z.number().finite(),
    z.boolean(),
    z.null(),
    z.array(JsonValueSchema),
    z.record(z.string(), JsonValueSchema),
  ]),
);

/** A run's review: how long it waits for a decision, and what it does when none comes. */
export const ReviewSettingsSchema = z
  .object({
    timeoutMinutes: z.number().int().min(1).max(MAX_REVIEW_MINUTES),
    onTimeout: z.enum(REVIEW_POLICIES),
  })
  .strict();

export const PublishInputSchema = z
  .object({
    documentId: DocumentIdSchema,
    title: z.string().min(1).max(300),
    textRef: TextRefSchema,
    /** The model that made the steps' results (the first model step's). */
    model: ModelInfoSchema,
    /**
     * Orders the runs of one document (epoch ms): the workflow time at which this run scheduled its publish step.
     * Every retry of the step sends the same value (it is part of the step's input), and a later run (a reset,
     * continue-as-new, a resubmission) schedules later, so the target can refuse a late delivery from an older
     * run instead of letting it overwrite a newer revision. Optional: runs scheduled before it existed send none.
     */
    scheduledAt: z.number().int().nonnegative().optional(),
    /**
     * The run whose key the delivery goes under, when it is not this one: a run whose delivery is held continues
     * as new before its history grows too long (workflows/index.ts), and the next run must send the delivery under
     * the key the first run sent it with (src/steps/idempotency.ts says why). Absent on every other path.
     */
    keyRunId: z.string().min(1).max(100).optional(),
  })
  // Each step's own fields (activities/index.ts, `publishes`: `summary`, `tags`, ...), as JSON values.
  .catchall(JsonValueSchema);
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
  /**
   * The publication store only: whether what was published differs from the document's previous revision (a
   * rerun whose changed step answered otherwise). Absent for a first revision, a duplicate, and a webhook.
   */
  changed: z.boolean().optional(),
});

// ---------------------------------------------------------------------------------------------------------------
// The workflow: its input, result and progress
// ---------------------------------------------------------------------------------------------------------------

/** A whole number option within its OPTION_LIMITS, defaulted. */
const option = (name: OptionName) => {
  const { min, max, default: fallback } = OPTION_LIMITS[name];
  return z.number().int().min(min).max(max).default(fallback);
};

export const PipelineOptionsSchema = z
  .object({
    /** Sentences in the summary. */
    maxSummarySentences: option('maxSummarySentences'),
    /** Tags to keep. */
    maxTags: option('maxTags'),
    /** Start-to-close timeout of each model call; large documents on slow local models need more. */
    modelTimeoutSeconds: option('modelTimeoutSeconds'),
    /**
     * Overall budget of each step, every retry included (schedule-to-close). Within it a step retries without an
     * attempt cap, so crashed or stalled workers never fail a document; provider errors have their own bounded
     * count (MAX_PROVIDER_ERRORS), kept by the activity.
     */
    stepBudgetMinutes: option('stepBudgetMinutes'),
  })
  .strict();
export type PipelineOptions = z.infer<typeof PipelineOptionsSchema>;

export const PipelineInputSchema = z
  .object({
    schemaVersion: z.literal(INPUT_SCHEMA_VERSION),
    documentId: DocumentIdSchema,
    textRef: TextRefSchema,
    title: z.string().min(TITLE_LENGTH.min).max(TITLE_LENGTH.max),
    options: PipelineOptionsSchema.default(() => PipelineOptionsSchema.parse({})),
    /** What the run's model calls may spend; a batch's runs share the batch's budget. */
    budget: BudgetInputSchema.optional(),
    /** A person approves, edits or rejects the draft before it is published (src/contract/review.ts, docs/review.md). */
    review: ReviewSettingsSchema.optional(),
    /** The run's agent steps are on, within these limits (docs/agent.md). */
    agent: AgentSettingsSchema.optional(),
  })
  .strict();
export type PipelineInput = z.input<typeof PipelineInputSchema>;
/** The input as the workflow uses it: checked, with the options' defaults filled in. */
export type CheckedPipelineInput = z.output<typeof PipelineInputSchema>;
/**
 * The input as it is, where it is already what PipelineInputSchema returns for it, unchanged (every option present,
 * nothing else): what the kit's clients send. The one definition of a complete input is the schema; undefined for
 * anything the schema refuses or would change (a missing option filled in), which the run checks as an older run
 * did (src/workflow/checks.ts).
 */
export function completePipelineInput(input: unknown): CheckedPipelineInput | undefined {
  const parsed = PipelineInputSchema.safeParse(input);
  return parsed.success && canonicalJson(parsed.data) === canonicalJson(input) ? parsed.data : undefined;
}

/** Compile-time proof that the workflow-safe name for a checked input (plain.ts) is exactly this type. */
const fastPathType: [CheckedPipelineInput, CompletePipelineInput] extends [
  CompletePipelineInput,
  CheckedPipelineInput,
]
  ? true
  : never = true;
void fastPathType;

/** The results of the steps before publish, as a run's result holds them (carried across continue-as-new). */
export type StepResultsBeforePublish = Record<string, ModelStepFields>;

/** A document's pipeline workflow, as the kit's client starts and queries it by DOCUMENT_WORKFLOW. */
export type DocumentPipeline = (
  rawInput: unknown,
  continuation?: PipelineContinuation,
) => Promise<PipelineResult>;

/**
 * A held delivery handed to the next run when its run continues as new: what publish sends (its key's run
 * included), the model steps' results (done, never run again), the key held and the wait reached so far.
 */
export interface HeldPublication {
  publish: PublishInput & { keyRunId: string };
  /** The results of the steps before publish, as the run's result holds them. */
  results: StepResultsBeforePublish;
  heldKey: string;
  waitMs: number;
  /** Batches that attached to this run (not its parent) and are told when it is held or goes on. */
  watchers: string[];
}

/**
 * The pipeline's second argument, absent on a first run: what a run that continued as new carries over, and,
 * for tests, the history length at which a held run continues as new.
 */
export interface PipelineContinuation {
  held?: HeldPublication;
  /** Events a held run's history may reach before it continues as new (default HELD_HISTORY_BUDGET). */
  historyBudget?: number;
}

export const StepStateSchema = z.enum(STEP_STATES);

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

/** Compile-time proof that the plain types of ./plain.ts (what workflow code reads) are what the schemas check. */
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : never) : never;
const plainTypes: [
  Same<z.infer<typeof UsageSchema>, Usage>,
  Same<z.infer<typeof ModelInfoSchema>, ModelInfo>,
  Same<z.infer<typeof ModelStepFieldsSchema>, ModelStepFields>,
  Same<z.infer<typeof PublishResultSchema>, PublishResult>,
] = [true, true, true, true];
void plainTypes;
