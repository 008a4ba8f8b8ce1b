/**
 * A batch with a budget, from the outside, as a user runs it: `npm run pipeline -- --budget-usd N <folder>` pauses
 * the documents whose next call would pass the budget and ends with exit code 5 and the command to raise it;
 * `npm run budget` lists it; `npm run budget -- raise` raises it and wakes the runs; the batch, submitted again,
 * finishes. The provider's own log (what it answered, at gpt-4o-mini's list price) says nothing was paid past the
 * budget and no answer was paid twice. The run's arithmetic on the time-skipping server is test/budget.test.ts.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { installQuietRuntime } from './helpers';
import { startAtLimits } from './provider-limits-run';
import { cleanupAfterAll, scratchDir } from './scratch';

installQuietRuntime();
const defer = cleanupAfterAll();

/**
 * gpt-4o-mini's list price, US dollars a million tokens (src/model/pricing.ts's default): prompt tokens the
 * provider served from its cache are billed at the cached price, as the invoice bills them.
 */
const PRICE = { input: 0.15, cachedInput: 0.075, output: 0.6 };
/** Room for a few of the documents: each call is held at the most it may be billed (its prompt's bytes, the framing, its whole answer). */
const BUDGET_USD = 0.003;
const RAISED_USD = 1;

describe('a batch with a budget in dollars', () => {
  it(
    'pauses at its budget with exit code 5, is raised by npm run budget, and finishes having paid no more than it allowed',
    { timeout: 300_000 },
    async (t) => {
      const pipeline = await startAtLimits(
        {
          provider: 'openai-compatible',
          // Limits far above the batch's calls: this test is about the budget.
          limits: { rpm: 6_000, tpm: 10_000_000 },
          configured: true,
          workers: 1,
          deadlineMs: 150_000,
        },
        scratchDir(defer, 'budget-run-'),
        defer,
      );
      const paid = (): number =>
        pipeline.provider
          .stats()
          .calls.filter((c) => c.status === 200)
          .reduce(
            (sum, c) =>
              sum +
              ((c.promptTokens - c.cachedTokens) * PRICE.input +
                c.cachedTokens * PRICE.cachedInput +
                c.completionTokens * PRICE.output) /
                1e6,
            0,
          );

      const first = await pipeline.command('pipeline', [
        '--budget-usd',
        String(BUDGET_USD),
        pipeline.documentsDir,
      ]);
      const said = `the client printed:\n${first.output.slice(-3000)}`;
      assert.equal(first.code, 5, said);
      assert.match(first.output, /WAITING FOR BUDGET /, said);
      const raise = /npm run budget -- raise (\S+) --usd/.exec(first.output);
      assert.ok(raise?.[1] !== undefined, `no command to raise the budget: ${said}`);
      const budgetId = raise[1];
      const spentFirst = paid();
      t.diagnostic(`paused at the budget: $${spentFirst.toFixed(6)} paid of $${BUDGET_USD}`);
      assert.ok(spentFirst > 0, 'some documents went through before the budget was reached');
      assert.ok(spentFirst <= BUDGET_USD, `paid $${spentFirst} past the budget of $${BUDGET_USD}`);

      const listed = await pipeline.command('budget', []);
      assert.equal(listed.code, 0, listed.output);
      assert.match(listed.output, new RegExp(`Budget ${budgetId}: spent \\$[\\d.]+ of \\$${BUDGET_USD}`));
      assert.match(listed.output, /\d+ run\(s\) waiting/);

      const refused = await pipeline.command('budget', ['raise', budgetId, '--usd', '0.0000001']);
      assert.equal(refused.code, 1, refused.output);
      assert.match(refused.output, /is below what budget .* has spent/);

      const raised = await pipeline.command('budget', ['raise', budgetId, '--usd', String(RAISED_USD)]);
      assert.equal(raised.code, 0, raised.output);
      assert.match(raised.output, /Woke [1-9]\d* waiting run\(s\)/);

      const second = await pipeline.command('pipeline', [
        '--budget-usd',
        String(BUDGET_USD),
        pipeline.documentsDir,
      ]);
      await pipeline.stop();
      const done = `the client printed:\n${second.output.slice(-3000)}`;
      assert.equal(second.code, 0, done);
      assert.match(
        second.output,
        new RegExp(`${pipeline.documents} of ${pipeline.documents} document\\(s\\) published, 0 failed`),
        done,
      );
      assert.match(
        second.output,
        /it was set when the batch first ran/,
        'a different --budget-usd is not taken silently',
      );
      assert.match(
        second.output,
        new RegExp(`Budget ${budgetId}: spent \\$[\\d.]+ of \\$${RAISED_USD}\\.`),
        done,
      );
      const stats = pipeline.provider.stats();
      assert.deepEqual(stats.paidTwice, [], 'answers paid twice');
      assert.equal(stats.answered, 2 * pipeline.documents, 'one paid call for each step of each document');
      t.diagnostic(`finished: $${paid().toFixed(6)} paid in all, ${stats.answered} calls`);
    },
  );

  it(
    'in a small window, tells the documents it never started from failed ones, and finishes them once raised',
    { timeout: 200_000 },
    async () => {
      const pipeline = await startAtLimits(
        {
          provider: 'openai-compatible',
          limits: { rpm: 6_000, tpm: 10_000_000 },
          configured: true,
          workers: 1,
          deadlineMs: 100_000,
          documents: 4,
          // One document at a time: once the first waits for its budget, the others are never started.
          env: { BATCH_WINDOW: '1' },
        },
        scratchDir(defer, 'budget-window-'),
        defer,
      );
      // Less than one document's calls: the first pauses before paying anything.
      const first = await pipeline.command('pipeline', ['--budget-usd', '0.00001', pipeline.documentsDir]);
      const said = `the client printed:\n${first.output.slice(-3000)}`;
      assert.equal(first.code, 5, said);
      assert.doesNotMatch(first.output, /FAILED/, said);
      assert.match(
        first.output,
        /0 of 4 document\(s\) published, 1 waiting for their budget, 3 not started yet/,
        said,
      );
      assert.equal(pipeline.provider.stats().answered, 0, 'nothing paid past the budget');
      const budgetId = /npm run budget -- raise (\S+) --usd/.exec(first.output)?.[1];
      assert.ok(budgetId !== undefined, said);
      const raised = await pipeline.command('budget', ['raise', budgetId, '--usd', String(RAISED_USD)]);
      assert.equal(raised.code, 0, raised.output);
      const second = await pipeline.command('pipeline', [pipeline.documentsDir]);
      await pipeline.stop();
      assert.equal(second.code, 0, second.output.slice(-3000));
      assert.match(second.output, /4 of 4 document\(s\) published/);
      assert.deepEqual(pipeline.provider.stats().paidTwice, []);
    },
  );
});
