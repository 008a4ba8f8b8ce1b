/**
 * The edges of the pacing (issue 40, "limits exceeded or misread"), each through the real store classes on both
 * backends and the tests' provider stand-in (test/provider-limits.ts), which speaks the providers' documented
 * headers and 429 bodies over HTTP.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { FailureType } from '../src/contract';
import { cleanupAfterAll } from './scratch';
import { startLimitedProvider } from './provider-limits';
import { summarizeRequest } from './requests';
import { PACING_STORES, pacedCall, pacedModel } from './rate-limit-stores';

const defer = cleanupAfterAll();

const words = (chars: number): string =>
  'Rust has ownership and borrowing. '.repeat(Math.ceil(chars / 34)).slice(0, chars);

for (const store of PACING_STORES) {
  describe(`limits at their edges (${store.name})`, () => {
    it('a call larger than the whole tokens-a-minute limit fails at once, saying which limit and by how much', async () => {
      // 12,000 tokens a minute; the big document alone is some 15,000 prompt tokens.
      const provider = await startLimitedProvider({ limits: { rpm: 600, tpm: 12_000 } });
      defer(() => provider.close());
      const [limits] = await store.open(defer);
      const model = pacedModel(limits, provider.baseUrl);
      const started = Date.now();
      const small = [1, 2].map(async (i) => {
        await model.ask(summarizeRequest(1), words(400), pacedCall(`small-${i}`, 30_000));
        return Date.now() - started;
      });
      const big = model.ask(summarizeRequest(1), words(60_000), pacedCall('big', 30_000));
      await assert.rejects(big, (err: unknown) => {
        assert.ok(err instanceof ApplicationFailure, String(err));
        assert.equal(err.type, FailureType.ModelRejected);
        assert.equal(err.nonRetryable, true);
        assert.match(
          err.message,
          /tokens per min \(TPM\) limit: the call needs \d+, the limit is 12000 a minute, \d+ over/,
        );
        return true;
      });
      const failedAfter = Date.now() - started;
      const times = await Promise.all(small);
      const sent = provider.stats().calls.filter((c) => c.idempotencyKey === 'big');
      assert.equal(sent.length, 1, `the big call was sent ${sent.length} times`);
      assert.ok(failedAfter < 5_000, `the big call failed after ${failedAfter} ms`);
      // The calls beside it take their own turns only (some 350 tokens each at 200 a second).
      assert.ok(Math.max(...times) < 8_000, `the small calls took ${times.join(', ')} ms`);
    });
  });
}
