/**
 * Budgets that pause instead of overspending, on the time-skipping server: a run whose next model call would pass
 * its budget shows the step waiting for budget, pays nothing past it, and goes on once the budget is raised
 * (the store's limit, and the signal `npm run budget -- raise` sends); it also looks again by itself on its timer.
 * The whole path through `npm run pipeline` and `npm run budget` is test/budget-run.test.ts.
 */
import { randomUUID } from 'node:crypto';
import { before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { budgetRaisedSignal, progressQuery } from '../src/workflow';
import type { PipelineProgress } from '../src/contract';
import {
  installQuietRuntime,
  localParts,
  modelServerFor,
  normalAnswer,
  pipelineInput,
  SAMPLE_TEXT,
  timeSkippingEnv,
  withPipeline,
} from './helpers';
import { cleanupAfterAll } from './scratch';

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();

before(async () => {
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
});

/** Asks the run's progress until `ok` holds, for up to 20 s of wall time. */
async function progressUntil(
  handle: { query: (q: typeof progressQuery) => Promise<PipelineProgress> },
  ok: (p: PipelineProgress) => boolean,
): Promise<PipelineProgress> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const progress = await handle.query(progressQuery).catch(() => undefined);
    if (progress !== undefined && ok(progress)) return progress;
    if (Date.now() > deadline) throw new Error(`progress never got there: ${JSON.stringify(progress)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('a run at its budget', () => {
  for (const wake of ['the signal npm run budget sends', 'its own timer'] as const) {
    it(`waits for its budget, pays nothing past it, and goes on once it is raised (woken by ${wake})`, async () => {
      const server = await modelServerFor(defer, normalAnswer);
      const local = await localParts({
        model: 'configured',
        env: {
          MODEL: 'openai-compatible:gpt-4o-mini',
          OPENAI_BASE_URL: server.baseUrl,
          // Known limits far above this test's calls: nothing waits to learn them.
          MODEL_RPM: '10000',
          MODEL_TPM: '10000000',
        },
      });
      defer(() => local.close());
      const budgetId = `budget-${randomUUID()}`;
      // Less than one call's estimate (its prompt and the most its answer may use, at gpt-4o-mini's price).
      const input = {
        ...(await pipelineInput(local.blobs, SAMPLE_TEXT)),
        budget: { id: budgetId, usd: 0.00001 },
      };
      const result = await withPipeline(env, local, input, async (handle) => {
        const waiting = await progressUntil(
          handle,
          (p) => p.steps.summarize === 'budget' && p.steps.tag === 'budget',
        );
        assert.equal(waiting.budgetId, budgetId);
        assert.equal(server.requests.length, 0, 'no call was paid past the budget');
        const listed = await local.rateLimits.waitingBudgets();
        assert.deepEqual(
          listed.map((w) => [w.budget.id, w.workflowIds]),
          [[budgetId, [handle.workflowId]]],
        );
        const raised = await local.rateLimits.setBudget(budgetId, { usd: 0.01 });
        assert.deepEqual(raised?.woken, [handle.workflowId]);
        if (wake === 'the signal npm run budget sends') await handle.signal(budgetRaisedSignal);
        const done = await handle.result();
        const after = await handle.query(progressQuery);
        assert.equal(after.budgetId, undefined, 'no longer shown waiting');
        return done;
      });
      assert.equal(result.publication?.revision, 1);
      assert.equal(server.requests.length, 2, 'one call each for summarize and tag');
      const budget = await local.rateLimits.budget(budgetId);
      assert.ok(budget !== undefined);
      assert.ok(budget.spentUsd > 0 && budget.spentUsd <= 0.01, `spent ${budget.spentUsd} of 0.01`);
      assert.equal(
        budget.spentTokens,
        result.summary.usage.inputTokens +
          result.summary.usage.outputTokens +
          result.tags.usage.inputTokens +
          result.tags.usage.outputTokens,
        'the budget counts what the answers used',
      );
    });
  }

  it('refuses a bad budget in the input with a message naming the field', async () => {
    const local = await localParts();
    defer(() => local.close());
    const input = { ...(await pipelineInput(local.blobs, SAMPLE_TEXT)), budget: { id: 'x', usd: -1 } };
    await assert.rejects(
      withPipeline(env, local, input, (handle) => handle.result()),
      (err: unknown) => {
        assert.match(String((err as { cause?: unknown }).cause), /budget\.usd/);
        return true;
      },
    );
  });
});
