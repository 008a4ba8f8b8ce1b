/**
 * Bulk mode's activities (docs/bulk.md): the batch workflow submits its documents' model requests as provider
 * batches (bulkSubmit), looks at them between its own timers (bulkPoll), stores their answers in the memo of paid
 * answers (bulkCollect), where each document's steps find them, and cancels them when the batch is cancelled
 * (bulkCancel). Each call is short: the day-long wait is the workflow's, not an activity's.
 */
import { ApplicationFailure, Context, log } from '@temporalio/activity';
import type { BatchEntry, BudgetCut } from '../contract/batch';
import type { BulkClaim, BulkCollected, SqlBulkClaims } from './claims';
import { budgetLeft, cutToBudget, worstCaseOf, worstOf } from './budget-cut';
import { findOrCreate } from './create-once';
import type { BulkApi, BulkLine, BulkOutcome, BulkRequestRecord, ProviderBatchState } from './types';
import { customIdFor } from './types';
import { FailureType, workflowIdFor } from '../contract';
import type { PipelineOptions, Usage } from '../contract';
import type { BlobStore } from '../documents/blobs';
import { ManifestReader } from '../documents/manifest';
import type { TextSource } from '../documents/text-source';
import type { AnswerMemo, MemoRequest } from '../model/memo';
import { estimateCost } from '../model/pricing';
import type { PriceTable } from '../model/pricing';
import type { BudgetRef, SqlRateLimits } from '../model/rate-limit-store';
import type { DocumentModel, ModelRequest } from '../model/types';
import { withHeartbeats } from '../steps/heartbeat';
import { modelSteps } from '../steps/define';
import type { StepList } from '../steps/define';
import { memoRequestFor } from '../steps/identity';

/** What bulk mode needs: the provider's batch API and the claims, beside the model steps' parts. */
export interface BulkDependencies {
  blobs: BlobStore;
  texts: TextSource;
  memo: AnswerMemo;
  model: DocumentModel;
  prices?: PriceTable;
  /**
   * Absent where the configured model has no batch API (offline, Ollama, OpenAI-compatible servers). `limits` holds
   * the budgets a submission is cut to.
   */
  bulk?: BulkParts;
}

/** The provider's batch API, the claims of its batches, and the store of budgets. */
export interface BulkParts {
  api: BulkApi;
  claims: SqlBulkClaims;
  limits: SqlRateLimits;
}

/** A provider batch of a round, as the workflow keeps it. */
export interface BulkPart {
  claimKey: string;
  providerBatchId: string;
  requests: number;
  state: ProviderBatchState;
}

export interface BulkSubmitInput {
  batchId: string;
  round: number;
  manifestRef: string;
  total: number;
  pipeline: PipelineOptions;
  /** Requests per provider batch at most. */
  maxRequests: number;
  /** The batch's budget: the round's submission is cut to what it has left. */
  budget?: BudgetRef | undefined;
}

export interface BulkSubmitted {
  parts: BulkPart[];
  /** Requests the memo answered already (an earlier batch, an earlier run): not sent. */
  answeredBefore: number;
  /** What the budget left did not cover: not sent in this round (the next, or the documents' own steps, ask). */
  cut?: BudgetCut | undefined;
}

/** How long a claim on a memo entry lasts while a collected answer is stored (bulk answers need no call). */
const STORE_LEASE_MS = 60_000;

export function createBulkActivities(steps: StepList, deps: BulkDependencies) {
  const manifests = new ManifestReader(deps.blobs);
  // A model step without a `bulk` input is asked one by one, by the document's own run.
  const bulkSteps = modelSteps(steps).filter((step) => step.bulk !== undefined);
  /** The request a record makes: its step's, from the input the record keeps. */
  const requestOf = (record: BulkRequestRecord): ModelRequest<unknown> => {
    const step = bulkSteps.find((s) => s.name === record.step);
    if (step === undefined)
      throw ApplicationFailure.create({
        type: FailureType.InvalidInput,
        nonRetryable: true,
        message:
          `a provider batch holds requests of step "${record.step}", which this worker's step list has no bulk ` +
          'input for: run workers whose step list has it until the batch is collected',
      });
    return memoRequestFor(step, { textRef: record.textRef, ...record.input }, deps.model, {
      workflowId: record.workflowId,
      runId: '',
    }).request;
  };
  const parts = (): BulkParts => {
    if (deps.bulk !== undefined) return deps.bulk;
    throw ApplicationFailure.create({
      type: FailureType.InvalidInput,
      nonRetryable: true,
      message:
        `bulk mode needs a provider with a batch API, and the workers' model is ${deps.model.info.provider}/` +
        `${deps.model.info.model}: set MODEL=openai:<model> or MODEL=anthropic:<model> on the workers, or run ` +
        'without BULK=on',
    });
  };

  /** The runs' memo requests in bulk: each document's model steps, as their activities will ask. */
  const requestsOf = async (input: BulkSubmitInput): Promise<BulkRequestRecord[]> => {
    const asked = bulkSteps.map((step) => ({ step, input: step.bulk?.(input.pipeline) ?? {} }));
    const records: BulkRequestRecord[] = [];
    const seen = new Set<string>();
    for (let offset = 0; offset < input.total; offset += 500) {
      const entries: BatchEntry[] = await manifests.range(
        input.manifestRef,
        offset,
        Math.min(500, input.total - offset),
      );
      for (const entry of entries) {
        const workflowId = workflowIdFor(entry.documentId);
        for (const { step, input: own } of asked) {
          // The entry the document's own step will look up (memoRequestFor is the one place keys are built).
          const { memoKey, requestHash, identity } = memoRequestFor(
            step,
            { textRef: entry.textRef, ...own },
            deps.model,
            {
              workflowId,
              runId: bulkRunId(input.batchId),
            },
          );
          // One request a memo key: a document listed twice with the same text is asked once, answered for both.
          if (seen.has(memoKey)) continue;
          seen.add(memoKey);
          records.push({
            customId: customIdFor(step.name, memoKey),
            memoKey,
            workflowId,
            step: step.name,
            requestHash,
            textRef: entry.textRef,
            input: own,
            identity,
          });
        }
      }
      Context.current().heartbeat();
    }
    return records;
  };

  /** The line of a request; `texts` keeps the texts read (each is read once). */
  const lineOf = async (record: BulkRequestRecord, texts: Map<string, string>): Promise<BulkLine> => {
    let text = texts.get(record.textRef);
    if (text === undefined) {
      text = await deps.texts.read(record.textRef);
      texts.set(record.textRef, text);
    }
    return { record, request: requestOf(record), text };
  };

  /** The lines of a claim's requests. */
  const linesOf = async (claim: BulkClaim, texts: Map<string, string>): Promise<BulkLine[]> => {
    const lines: BulkLine[] = [];
    for (const record of claim.requests) lines.push(await lineOf(record, texts));
    return lines;
  };

  /**
   * The pending requests that the budget left covers at their worst case, each marked with it (kept on its claim,
   * promised until the claim is collected), and what was cut. The round's claims not yet collected are promised.
   */
  const fitBudget = async (
    pending: readonly BulkRequestRecord[],
    existing: readonly BulkClaim[],
    budget: BudgetRef,
    texts: Map<string, string>,
  ): Promise<{ kept: BulkRequestRecord[]; cut: BudgetCut | undefined }> => {
    const { api, limits } = parts();
    const priced = { info: deps.model.info, prices: deps.prices ?? {} };
    const marked: BulkRequestRecord[] = [];
    for (const record of pending) {
      const line = await lineOf(record, texts);
      const worst = worstCaseOf(api.worstInputTokens(line), line.request.maxOutputTokens, priced, budget);
      marked.push({ ...record, worst });
    }
    const promised = worstOf(existing.filter((c) => c.collected === null).flatMap((c) => c.requests));
    const left = budgetLeft(await limits.budget(budget.id), budget, promised);
    return cutToBudget(marked, left, budget.id);
  };

  /**
   * The provider batch of a claim: the one recorded; else the one an interrupted attempt (or a create whose answer
   * was lost) made, found at the provider; else a new one (findOrCreate), recorded at once.
   */
  const batchOf = async (
    claim: BulkClaim,
    texts: Map<string, string>,
    signal: AbortSignal,
  ): Promise<BulkPart> => {
    const { api, claims } = parts();
    const requests = claim.requests.length;
    if (claim.providerBatchId !== null) {
      const state = await api.retrieve(claim.providerBatchId, signal);
      return { claimKey: claim.claimKey, providerBatchId: state.id, requests, state };
    }
    const { state, found } = await findOrCreate(
      api,
      claim,
      { taken: () => claims.taken(api.provider), lines: () => linesOf(claim, texts) },
      signal,
    );
    if (found)
      log.info('Found the provider batch an interrupted attempt created; not creating another', {
        claimKey: claim.claimKey,
        providerBatchId: state.id,
      });
    const recorded = await claims.record(claim.claimKey, state.id);
    return { claimKey: claim.claimKey, providerBatchId: recorded, requests, state };
  };

  return {
    /**
     * Submits a round: the requests the memo has no answer for and no claim of the round covers, in provider
     * batches of at most `maxRequests`, each claimed before it is created. A claim an interrupted attempt left
     * without a batch is looked up at the provider first. Returns every provider batch of the round.
     */
    async bulkSubmit(input: BulkSubmitInput): Promise<BulkSubmitted> {
      const { api, claims } = parts();
      return withHeartbeats(async (signal) => {
        const runId = bulkRunId(input.batchId);
        const records = await requestsOf(input);
        const memo = await deps.memo.peek(
          records.map((r) => r.memoKey),
          runId,
        );
        const existing = await claims.ofBatch(input.batchId, input.round);
        const claimed = new Set(existing.flatMap((c) => c.requests.map((r) => r.customId)));
        const unclaimed = records
          .filter((r) => memo.get(r.memoKey)?.answered !== true && !claimed.has(r.customId))
          .map((r) => {
            const hint = memo.get(r.memoKey)?.rejected.at(-1)?.error;
            return hint === undefined ? r : { ...r, retryHint: hint };
          });
        const texts = new Map<string, string>();
        const { kept: pending, cut } =
          input.budget === undefined
            ? { kept: unclaimed, cut: undefined }
            : await fitBudget(unclaimed, existing, input.budget, texts);
        if (cut !== undefined)
          log.info('Cut the provider batches to the budget left: the rest is asked later', {
            batchId: input.batchId,
            round: input.round,
            ...cut,
          });
        const made: BulkClaim[] = [...existing];
        for (let i = 0; i < pending.length; i += input.maxRequests) {
          made.push(
            await claims.claim({
              claimKey: `${input.batchId}:r${input.round}:p${made.length}`,
              batchId: input.batchId,
              round: input.round,
              provider: api.provider,
              requests: pending.slice(i, i + input.maxRequests),
            }),
          );
        }
        const submitted: BulkPart[] = [];
        for (const claim of made) submitted.push(await batchOf(claim, texts, signal));
        const answeredBefore = records.filter((r) => memo.get(r.memoKey)?.answered === true).length;
        return { parts: submitted, answeredBefore, ...(cut === undefined ? {} : { cut }) };
      });
    },

    /** The provider batch's state now (status and counts). */
    async bulkPoll(input: { providerBatchId: string }): Promise<ProviderBatchState> {
      return withHeartbeats((signal) => parts().api.retrieve(input.providerBatchId, signal));
    },

    /**
     * Stores an ended provider batch's answers in the memo, each as a paid answer at the batch price; a refused
     * one is kept with its tokens, for the next round to quote; what it cost is charged to the batch's budget.
     * Done once per claim: a repeat returns the count.
     */
    async bulkCollect(input: { claimKey: string; budget?: BudgetRef | undefined }): Promise<BulkCollected> {
      const { api, claims } = parts();
      const claim = await claims.get(input.claimKey);
      if (claim?.providerBatchId == null)
        throw ApplicationFailure.create({
          type: FailureType.InvalidInput,
          nonRetryable: true,
          message: `the bulk claim ${input.claimKey} has no provider batch to collect`,
        });
      if (claim.collected !== null) return claim.collected;
      const providerBatchId = claim.providerBatchId;
      return withHeartbeats(async (signal) => {
        const byId = new Map(claim.requests.map((r) => [r.customId, r]));
        // The request each answer is read by (its shape, and what the step keeps of it).
        const readers = new Map(claim.requests.map((r) => [r.customId, requestOf(r)]));
        const tally = new CollectTally(deps, claim.claimKey);
        let seen = 0;
        for await (const outcome of api.results(providerBatchId, readers, signal)) {
          const record = byId.get(outcome.customId);
          if (record === undefined) continue;
          await store(deps, claim, record, outcome);
          tally.add(outcome);
          if (++seen % 200 === 0) Context.current().heartbeat();
        }
        const collected = tally.result();
        // What the batch cost counts against the batch's budget, as each call one by one does.
        await claims.collected(claim.claimKey, collected, input.budget);
        return collected;
      });
    },

    /**
     * Cancels the batch's provider batches that have not been collected (its cancellation, `npm run bulk -- cancel`),
     * those an interrupted submission made included; returns them, for the workflow to collect what they answered.
     */
    async bulkCancel(input: { batchId: string }): Promise<BulkPart[]> {
      const { api, claims } = parts();
      return withHeartbeats(async (signal) => {
        const cancelled: BulkPart[] = [];
        for (const claim of await claims.ofBatch(input.batchId)) {
          if (claim.providerBatchId === null || claim.collected !== null) continue;
          const state = await api.retrieve(claim.providerBatchId, signal);
          cancelled.push({
            claimKey: claim.claimKey,
            providerBatchId: claim.providerBatchId,
            requests: claim.requests.length,
            state: state.ended ? state : await api.cancel(claim.providerBatchId, signal),
          });
        }
        return cancelled;
      });
    },
  };
}

export type BulkActivities = ReturnType<typeof createBulkActivities>;

/** The run ID bulk mode's memo entries are made under: refused answers are counted per run, as a run's are. */
export function bulkRunId(batchId: string): string {
  return `bulk:${batchId}`;
}

/** Stores one outcome in the memo: an answer completes the entry, a refused one is kept with its tokens. */
async function store(
  deps: BulkDependencies,
  claim: BulkClaim,
  record: BulkRequestRecord,
  outcome: BulkOutcome,
): Promise<void> {
  if (outcome.kind !== 'answered' && outcome.kind !== 'refused') return;
  const request: MemoRequest = {
    memoKey: record.memoKey,
    workflowId: record.workflowId,
    runId: bulkRunId(claim.batchId),
    step: record.step,
    requestHash: record.requestHash,
  };
  const owner = `bulk:${claim.claimKey}`;
  const found = await deps.memo.claim(request, owner, STORE_LEASE_MS);
  if (found.kind === 'answered') return;
  if (outcome.kind === 'answered') {
    // First answer stored wins: another attempt's, if one stored first (this one is paid all the same).
    await deps.memo.complete(record.memoKey, {
      value: outcome.value,
      usage: outcome.usage,
      model: deps.model.info,
      bulkClaim: claim.claimKey,
      ...(record.identity === undefined ? {} : { identity: record.identity }),
    });
    return;
  }
  // A repeat of the collect after a crash keeps the refusal once.
  if (found.kind === 'owned' && found.rejected.some((r) => r.bulkClaim === claim.claimKey)) {
    await deps.memo.release(record.memoKey, owner, {});
    return;
  }
  await deps.memo.release(record.memoKey, owner, {
    rejected: {
      runId: request.runId,
      usage: outcome.usage,
      model: deps.model.info,
      error: outcome.error,
      bulkClaim: claim.claimKey,
    },
  });
}

/** Counts and costs of a provider batch's outcomes. */
class CollectTally {
  private readonly counts = { answered: 0, refused: 0, errored: 0, expired: 0, canceled: 0 };
  private inputTokens = 0;
  private outputTokens = 0;
  private costUsd: number | null = 0;
  private listCostUsd: number | null = 0;

  constructor(
    private readonly deps: BulkDependencies,
    private readonly claimKey: string,
  ) {}

  add(outcome: BulkOutcome): void {
    this.counts[outcome.kind]++;
    if (outcome.kind === 'answered' || outcome.kind === 'refused') this.paid(outcome.usage);
  }

  private paid(usage: Usage): void {
    const prices = this.deps.prices ?? {};
    const info = this.deps.model.info;
    this.inputTokens += usage.inputTokens;
    this.outputTokens += usage.outputTokens;
    const batch = estimateCost(prices, info, usage, 'batch');
    const list = estimateCost(prices, info, usage, 'direct');
    this.costUsd = this.costUsd === null || batch === null ? null : this.costUsd + batch;
    this.listCostUsd = this.listCostUsd === null || list === null ? null : this.listCostUsd + list;
  }

  result(): BulkCollected {
    log.info('Collected a provider batch into the memo', { claimKey: this.claimKey, ...this.counts });
    return {
      ...this.counts,
      inputTokens: this.inputTokens,
      outputTokens: this.outputTokens,
      costUsd: this.costUsd,
      listCostUsd: this.listCostUsd,
    };
  }
}
