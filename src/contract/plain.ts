/**
 * The part of the contract that workflow code reads on every run: the task queue, the failure types, the steps and
 * their states, the workflow ID, the input's schema version. Plain values and types, no schema library: in the
 * workflow sandbox every run evaluates the modules it imports afresh, and building the zod schemas of
 * ./index.ts cost each document's first workflow task ~20 ms (npm run bench). The schemas themselves live in
 * ./index.ts, which re-exports all of this; workers check results with them, and a run an input that is not
 * complete (src/workflow/checks.ts).
 */
import { ApplicationFailure } from '@temporalio/common';
import type { ReviewOutcome, ReviewOutcomeName, ReviewSettings } from './review';

export const DEFAULT_TASK_QUEUE = 'document-pipeline';

export type { JsonValue, ModelInfo } from './values';
import type { ModelInfo } from './values';
export * from './agent';
import type { AgentSettings, AgentSummary } from './agent';

/** A model call's tokens (UsageSchema in ./index.ts says what each counts). */
export type Usage = {
  inputTokens: number;
  outputTokens: number;
  cachedInputTokens?: number | undefined;
  cacheWriteInputTokens?: number | undefined;
};

/** What every model step's result carries besides its fields (ModelStepFieldsSchema in ./index.ts, documented there). */
export type ModelStepFields = {
  idempotencyKey: string;
  model: ModelInfo;
  usage: Usage;
  memoised: boolean;
  estimatedCostUsd?: number | null | undefined;
  rejectedUsage?: Usage | undefined;
  bulk?: { claim: string; listCostUsd: number | null } | undefined;
  identity?: string | undefined;
  changedFrom?: string | undefined;
  agent?: AgentSummary | undefined;
};

/** ModelStepFields' names: what a model step's result carries besides the fields it adds to the publication. */
const FIELD_NAMES = [
  'idempotencyKey',
  'model',
  'usage',
  'memoised',
  'estimatedCostUsd',
  'rejectedUsage',
  'bulk',
  'identity',
  'changedFrom',
  'agent',
] as const;
export const MODEL_STEP_FIELD_NAMES: readonly string[] = FIELD_NAMES;
// Every name of ModelStepFields is listed, and only those: a new field fails to compile until it is listed here.
const listedAll: [keyof ModelStepFields] extends [(typeof FIELD_NAMES)[number]] ? true : never = true;
const listedOnly: [(typeof FIELD_NAMES)[number]] extends [keyof ModelStepFields] ? true : never = true;
void [listedAll, listedOnly];

/** What the publish step returns (PublishResultSchema in ./index.ts, documented there). */
export type PublishResult = {
  idempotencyKey: string;
  target: 'sqlite' | 'postgres' | 'webhook';
  documentId: string;
  revision: number;
  duplicate: boolean;
  superseded?: boolean | undefined;
  receiverHonoursKey?: boolean | undefined;
  changed?: boolean | undefined;
};

/**
 * A run's result: the model steps' results under their keys (`summary`, `tags`, ...; `Results`, from the step
 * list), then the publication's.
 */
export type PipelineResult<Results extends object = Record<never, never>> = {
  documentId: string;
  title: string;
  /** Absent only when a review rejected the draft (or its deadline did): nothing was published. */
  publication?: PublishResult;
  /** Runs with a review: how it ended (an edit lists what was published in place of the draft). */
  review?: ReviewOutcome;
} & Results;

/** Bumped whenever PipelineInput changes shape; older inputs are refused with a message, never guessed at. */
export const INPUT_SCHEMA_VERSION = 1;

/** A document's ID: what DocumentIdSchema checks. */
export const DOCUMENT_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
/** A budget's ID: what BudgetInputSchema checks. */
export const BUDGET_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$/;
/** A blob reference: what TextRefSchema checks. */
export const TEXT_REF = /^sha256:[0-9a-f]{64}$/;
/** A document title's length, in UTF-16 code units as zod counts them. */
export const TITLE_LENGTH = { min: 1, max: 300 } as const;
/** Each option's range (whole numbers) and default: what PipelineOptionsSchema checks and fills in. */
export const OPTION_LIMITS = {
  maxSummarySentences: { min: 1, max: 20, default: 3 },
  maxTags: { min: 1, max: 20, default: 5 },
  modelTimeoutSeconds: { min: 1, max: 3600, default: 120 },
  stepBudgetMinutes: { min: 1, max: 7 * 24 * 60, default: 60 },
} as const;
export type OptionName = keyof typeof OPTION_LIMITS;

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
  /**
   * The provider pushed back (429, or "overloaded": 503, Anthropic's 529), or the fleet's pacing gave this call a
   * turn further off than the attempt should wait for: back-pressure, never counted as a provider error; the next
   * attempt comes at the time the provider or the pacing named.
   */
  ProviderBusy: 'ProviderBusy',
  /** A model call would pass the run's or the batch's budget: the run pauses until the budget is raised. */
  BudgetExhausted: 'BudgetExhausted',
} as const;

/** A step's name: its activity's name and explicit activity ID, so idempotency keys read `<runId>:<step>`. */
export type StepName = string;

/** The workflow type of a document's pipeline (workflows/index.ts exports it under this name). */
export const DOCUMENT_WORKFLOW = 'documentPipeline';

/** The publish step's name: the kit carries the publication out (the publisher, the ledger), so it names it. */
export const PUBLISH_STEP = 'publish';

/**
 * `held`: the publish step's delivery may have landed unanswered, and waits for a verdict (npm run deliveries).
 * `budget`: a model step's next call would pass the run's budget; it waits for the budget to be raised
 * (npm run budget).
 */
export const STEP_STATES = ['pending', 'running', 'done', 'failed', 'held', 'budget'] as const;
export type StepState = (typeof STEP_STATES)[number];
export interface PipelineProgress {
  documentId: string;
  /** The steps that have started, by name; a step not listed is pending. */
  steps: Partial<Record<StepName, StepState>>;
  /** While the publish step is held: the delivery's key, the one to settle. */
  heldKey?: string;
  /** While a model step waits for its budget to be raised: the budget's ID. */
  budgetId?: string;
  /** Runs with a review only: `awaiting` while the draft waits for a person, then how the review ended. */
  review?: 'awaiting' | ReviewOutcomeName;
}

/** What a run tells its batch when it starts or stops awaiting review. */
export interface ReviewNotice {
  workflowId: string;
  awaiting: boolean;
}

/** A budget of tokens and US dollars a run's model calls may spend; a batch's runs share the batch's. */
export interface BudgetInput {
  /** Names the budget in the store and on the command line (npm run budget -- raise <id>). */
  id: string;
  tokens?: number;
  usd?: number;
}

/** What a run tells its batch when it starts or stops waiting for its budget. */
export interface BudgetNotice {
  workflowId: string;
  /** The budget waited for; undefined once the run goes on. */
  budgetId: string | undefined;
}

/** The budget a BudgetExhausted failure names in its details. */
export function budgetIdOf(details: readonly unknown[] | undefined | null): string | undefined {
  const first: unknown = details?.[0];
  if (typeof first !== 'object' || first === null || !('budget' in first)) return undefined;
  const budget: unknown = first.budget;
  if (typeof budget !== 'object' || budget === null || !('id' in budget)) return undefined;
  return typeof budget.id === 'string' ? budget.id : undefined;
}

/** What a run tells its batch when its delivery is held or goes on again. */
export interface HeldNotice {
  workflowId: string;
  /** The delivery's key while held; undefined once it goes on. */
  heldKey: string | undefined;
}

/** The key a DeliveryHeld failure names in its details (the delivery to settle). */
export function heldKeyOf(details: readonly unknown[] | undefined | null): string | undefined {
  const first: unknown = details?.[0];
  if (typeof first !== 'object' || first === null || !('heldKey' in first)) return undefined;
  return typeof first.heldKey === 'string' ? first.heldKey : undefined;
}

/** The progress of a run that has just started: every step pending. */
export function initialProgress(documentId: string): PipelineProgress {
  return { documentId, steps: {} };
}

/** The step an idempotency key (`<runId>:<step>`, activities' keys) belongs to. */
export function stepNameOfKey(key: string): StepName {
  return key.slice(key.lastIndexOf(':') + 1);
}

/** The workflow ID for a document: the same document always maps to the same run, so a resubmission attaches. */
export function workflowIdFor(documentId: string): string {
  return `document-${documentId}`;
}

/** Inputs written by older (or newer) code get a clear refusal instead of a guess at what their fields meant. */
export function refuseOtherSchemaVersions(rawInput: unknown): void {
  // Own fields only: an inherited `schemaVersion` (or any Object.prototype name) is not something the client sent.
  if (typeof rawInput !== 'object' || rawInput === null || !Object.hasOwn(rawInput, 'schemaVersion')) return;
  const version: unknown = Reflect.get(rawInput, 'schemaVersion');
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

/** The input a run uses: what PipelineInputSchema returns (the type is checked against it in src/contract/index.ts). */
export interface CompletePipelineInput {
  schemaVersion: typeof INPUT_SCHEMA_VERSION;
  documentId: string;
  textRef: string;
  title: string;
  options: Record<OptionName, number>;
  budget?: BudgetInput;
  /** A person reviews the draft before it is published (src/contract/review.ts). */
  review?: ReviewSettings;
  /** The run's agent steps are on, within these limits (src/contract/agent.ts, docs/agent.md). */
  agent?: AgentSettings;
}

/**
 * The model steps' results within a workflow result, whichever steps there are: for usage and cost totals. A
 * result is a model step's when it has ModelStepFieldsSchema's fields (checked here without the schema, so the
 * batch workflow can sum them in the sandbox; test/input-check.test.ts holds the check to the schema).
 */
export function modelStepResults(result: object): ModelStepFields[] {
  return Object.values(result as Record<string, unknown>).filter((value) => isModelStepFields(value));
}

/** True when `value` passes ModelStepFieldsSchema. */
export function isModelStepFields(value: unknown): value is ModelStepFields {
  if (!isObject(value)) return false;
  const { idempotencyKey, model, usage, memoised, estimatedCostUsd, rejectedUsage } = value;
  return (
    typeof idempotencyKey === 'string' &&
    isObject(model) &&
    typeof model.provider === 'string' &&
    model.provider.length > 0 &&
    typeof model.model === 'string' &&
    isUsage(usage) &&
    typeof memoised === 'boolean' &&
    (estimatedCostUsd === undefined ||
      estimatedCostUsd === null ||
      (typeof estimatedCostUsd === 'number' && Number.isFinite(estimatedCostUsd) && estimatedCostUsd >= 0)) &&
    (rejectedUsage === undefined || isUsage(rejectedUsage))
  );
}

function isUsage(value: unknown): boolean {
  if (!isObject(value)) return false;
  const count = (n: unknown) => typeof n === 'number' && Number.isSafeInteger(n) && n >= 0;
  return count(value.inputTokens) && count(value.outputTokens);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
