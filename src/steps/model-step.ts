import { Context, log } from '@temporalio/activity';
import type { Info } from '@temporalio/activity';
import type { Attributes } from '@opentelemetry/api';
import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import { claimantName } from '../lib/claimant';
import type { AnswerMemo, MemoRequest } from '../model/memo';
import { MemoCall, paidButRefused, paidUsageOf } from '../model/memo-call';
import type { MemoAnswer } from '../model/memo-call';
import { estimateCost } from '../model/pricing';
import type { PriceTable } from '../model/pricing';
import type { BudgetRef } from '../model/rate-limit-store';
import type { DocumentModel, ModelAnswer } from '../model/types';
import { BudgetInputSchema, describeIssues, DocumentIdSchema, FailureType, TextRefSchema } from '../contract';
import type { ModelStepFields, Usage } from '../contract';
import type { TextSource } from '../documents/text-source';
import { noMetrics } from '../telemetry/metrics';
import type { PipelineMetrics } from '../telemetry/metrics';
import { timed } from '../telemetry/phases';
import { genAiRequestAttributes, genAiUsageAttributes, inSpan } from '../telemetry/spans';
import { HEARTBEAT_EVERY_MS, withHeartbeats } from './heartbeat';
import { idempotencyKey } from './idempotency';
import { stepInput } from './check-input';
import type { AnyModelStep, DocumentStepInput, ModelStepResultOf, StepFields } from './define';
import { memoRequestFor } from './identity';

/** What the kit gives every model step besides its own input (DocumentStepInput), as the worker checks it. */
const DocumentStepInputSchema = z.object({
  documentId: DocumentIdSchema,
  textRef: TextRefSchema,
  budget: BudgetInputSchema.optional(),
});

/** What every model step needs: the model, the memo of paid answers, the texts, prices, and the budgets. */
export interface ModelStepDependencies {
  model: DocumentModel;
  memo: AnswerMemo;
  texts: TextSource;
  prices?: PriceTable;
  /** Life of a memo claim without renewal: how long a stalled or dead owner keeps others waiting. */
  memoLeaseMs?: number;
  /** Provider errors (error statuses, timeouts, refused answers) one run's step may meet before it fails. */
  maxProviderErrors?: number;
  /** Where tokens, cost and memo hits are counted (the worker's metrics page); nowhere by default. */
  metrics?: PipelineMetrics;
}

/** A model step's answer: the value, its tokens and cost for this run (refused answers too), and whether it was reused. */
export type ModelStepAnswer<T> = MemoAnswer<T>;

/**
 * A model step's activity, from its definition: check the input, read the text by reference, get the answer
 * through the memo of paid answers while heartbeating, check the answer, and return the step's fields with the
 * key, model, tokens and cost. The memo key is the step's identity and input (src/steps/identity.ts), so a
 * resubmitted document reuses what a failed run paid for, a changed step is asked again, and a different request
 * is never answered with another's answer.
 */
export function modelStepActivity<D extends AnyModelStep>(step: D, deps: ModelStepDependencies) {
  const inputSchema = DocumentStepInputSchema.extend(ownShape(step)).strict();
  const activity = async (rawInput: unknown): Promise<ModelStepResultOf<D>> => {
    // The schema is the document's fields extended with the step's own: zod types the extension loosely.
    const checked = stepInput(inputSchema, rawInput, `${step.name} input`) as DocumentStepInput &
      Record<string, unknown>;
    // The document ID is in the step's key already (its workflow ID); what shapes the answer is the text.
    const { documentId: _documentId, textRef, budget, ...own } = checked;
    const { fields, ...answer } = await askThroughMemo(deps, step, { textRef, budget, own });
    const problem = step.refuse?.(fields);
    if (problem !== undefined)
      throw ApplicationFailure.create({
        type: FailureType.InvalidDocument,
        nonRetryable: true,
        message: `document ${textRef}: ${problem}`,
      });
    return { ...fields, ...answer } as ModelStepResultOf<D>;
  };
  // The activity is registered under the step's name; so it reads in stack traces and logs too.
  Object.defineProperty(activity, 'name', { value: step.name });
  return activity;
}

/** The step's own input fields, as a zod shape (its `input` is an object schema). */
function ownShape(step: AnyModelStep): z.ZodRawShape {
  const schema: unknown = step.input;
  if (schema instanceof z.ZodObject) return schema.shape;
  throw new Error(`step "${step.name}": its input must be a z.object({...}) of the step's own fields`);
}

interface Asked {
  textRef: string;
  budget: BudgetRef | undefined;
  own: object;
}

/** The answer to the step's request for this attempt: from the memo, or paid for once under the memo's claim. */
async function askThroughMemo(
  deps: ModelStepDependencies,
  step: AnyModelStep,
  { textRef, budget, own }: Asked,
): Promise<Omit<ModelStepAnswer<StepFields>, 'value'> & ModelStepFields & { fields: StepFields }> {
  const attemptStarted = Date.now();
  const { info } = Context.current();
  const key = idempotencyKey(info);
  const workflowId = info.workflowExecution?.workflowId ?? info.activityId;
  const memoRequest = memoRequestFor(step, { textRef, ...own }, deps.model, {
    workflowId,
    runId: info.workflowExecution?.runId ?? key,
  });
  const { request, identity } = memoRequest;
  const pacing = { step: step.name, workflowId, budget, ...deadlinesOf(info, attemptStarted) };
  const text = await timed('text read', () => deps.texts.read(textRef));
  const paid = new PaidCalls(deps, step.name, key);
  // Dedupe before effect: the attempt claims the step's memo entry, and only the claim's owner calls the model.
  const { value, ...answer } = await withHeartbeats((signal) =>
    memoCallOf(deps, memoRequest, step.fields, `attempt-${info.attempt}`, signal).answer((retryHint) =>
      paid.call(async () =>
        fitting(
          step,
          await deps.model.ask(request, text, {
            idempotencyKey: key,
            signal: callSignal(signal, attemptStarted),
            ...(retryHint === undefined ? {} : { retryHint }),
            pacing,
          }),
        ),
      ),
    ),
  );
  if (paid.count === 0) (deps.metrics ?? noMetrics).memoHit(step.name);
  const changedFrom = answer.memoised ? undefined : await previousIdentity(deps, memoRequest, identity);
  return {
    fields: value as StepFields,
    ...answer,
    idempotencyKey: key,
    identity,
    ...(changedFrom === undefined ? {} : { changedFrom }),
  };
}

/**
 * The answer, when it fits the step's fields; else it is refused before it is stored, as a paid answer of the
 * wrong shape (counted in the cost; the next attempt quotes why to the model).
 */
function fitting<T>(step: AnyModelStep, answer: ModelAnswer<T>): ModelAnswer<T> {
  const fits = step.fields.safeParse(answer.value);
  if (fits.success) return answer;
  throw paidButRefused(
    `the answer does not fit the ${step.name} step's fields (${describeIssues(fits.error)})`,
    answer.usage,
  );
}

/** The identity of this document's earlier answer to the step, when it was another: the step changed since. */
async function previousIdentity(
  deps: ModelStepDependencies,
  request: MemoRequest,
  identity: string,
): Promise<string | undefined> {
  const previous = await deps.memo.previousAnswer(request.workflowId, request.step, request.memoKey);
  if (previous === undefined) return undefined;
  // Entries stored before identities were recorded changed too: they are under the old keys.
  const before = previous.identity ?? 'unrecorded';
  return before === identity ? undefined : before;
}

/** This attempt's way to the answer through the memo, under a claim named for the attempt. */
export function memoCallOf<T>(
  deps: ModelStepDependencies,
  request: MemoRequest & { identity?: string },
  valueSchema: z.ZodType<T>,
  attempt: string,
  signal: AbortSignal,
): MemoCall<T> {
  return new MemoCall({
    request,
    memo: deps.memo,
    model: deps.model.info,
    valueSchema,
    identity: request.identity,
    owner: claimantName(attempt),
    signal,
    log,
    prices: deps.prices,
    leaseMs: deps.memoLeaseMs,
    renewEveryMs: HEARTBEAT_EVERY_MS,
    maxProviderErrors: deps.maxProviderErrors,
  });
}

/**
 * The model calls this attempt pays for, each a span of its own in the document's trace (the key and the model,
 * never the text). Tokens and cost are counted where they are spent, at each call, kept or refused: the step's
 * answer may come from the memo although this attempt paid too (another stored first), and a step that fails for
 * good has no answer to count from.
 */
export class PaidCalls {
  count = 0;
  private readonly attributes: Attributes;

  constructor(
    private readonly deps: ModelStepDependencies,
    private readonly step: string,
    key: string,
  ) {
    const { provider, model } = deps.model.info;
    this.attributes = {
      'pipeline.step': step,
      'pipeline.idempotency_key': key,
      // The older name of the provider attribute, kept for dashboards that read it.
      'gen_ai.system': provider,
      ...genAiRequestAttributes({ provider, model }),
    };
  }

  /** Makes one call in its span, counting what the provider was paid even when the answer is refused. */
  call<T>(ask: () => Promise<ModelAnswer<T>>): Promise<ModelAnswer<T>> {
    return inSpan('model call', this.attributes, async (span) => {
      let paid: ModelAnswer<T>;
      try {
        paid = await ask();
      } catch (err) {
        const refused = paidUsageOf(err);
        if (refused !== undefined) this.counted(refused);
        throw err;
      }
      span.setAttributes(genAiUsageAttributes(paid.usage, this.counted(paid.usage)));
      return paid;
    });
  }

  /** Counts one paid answer's tokens and cost; returns the cost. */
  private counted(usage: Usage): number | null {
    this.count++;
    const cost = estimateCost(this.deps.prices ?? {}, this.deps.model.info, usage);
    (this.deps.metrics ?? noMetrics).modelPaid(this.step, this.deps.model.info, usage, cost);
    return cost;
  }
}

/** The attempt's start-to-close deadline and the step's schedule-to-close one, on this worker's clock. */
export function deadlinesOf(
  info: Pick<Info, 'startToCloseTimeoutMs' | 'scheduleToCloseTimeoutMs' | 'scheduledTimestampMs'>,
  attemptStarted: number,
): { attemptEndsAt: number; stepEndsAt: number } {
  return {
    attemptEndsAt: info.startToCloseTimeoutMs > 0 ? attemptStarted + info.startToCloseTimeoutMs : Infinity,
    stepEndsAt:
      info.scheduleToCloseTimeoutMs > 0
        ? info.scheduledTimestampMs + info.scheduleToCloseTimeoutMs
        : Infinity,
  };
}

/**
 * The signal a model call gets: the attempt's, except when the server has given up on the attempt before its
 * start-to-close timeout (a stall past the heartbeat timeout: a GC pause, a frozen VM, a server that was down; the
 * attempt learns so on waking). Such a call is not cut off: its answer may be in the socket already, or on its way,
 * and paid for either way, while the attempt that took over waits on this attempt's claim, still renewed; storing
 * that answer is what keeps it from paying again. It may run until the attempt's own start-to-close deadline, the
 * time the step gives a model call (modelTimeoutSeconds, reckoned from `attemptStarted` on this worker's clock), or
 * end sooner at the model client's request timeout; either releases the claim. A call still going at that
 * deadline is hung, and is stopped. A cancellation the workflow asked for, or a worker shutting down, stops the
 * call at once. (A fixed grace of one second paid twice whenever the answer came later, as on a loaded machine.)
 */
export function callSignal(
  attempt: AbortSignal,
  attemptStarted: number,
  context = Context.current(),
): AbortSignal {
  const call = new AbortController();
  const follow = (): void => {
    const details = context.cancellationDetails;
    if (details?.notFound === true || details?.timedOut === true) {
      const { startToCloseTimeoutMs } = context.info;
      const left = startToCloseTimeoutMs > 0 ? attemptStarted + startToCloseTimeoutMs - Date.now() : Infinity;
      if (left <= 0) call.abort(attempt.reason);
      else if (Number.isFinite(left)) setTimeout(() => call.abort(attempt.reason), left).unref();
      return;
    }
    call.abort(attempt.reason);
  };
  if (attempt.aborted) follow();
  else attempt.addEventListener('abort', follow, { once: true });
  return call.signal;
}
