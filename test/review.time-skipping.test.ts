/**
 * The review's deadline on the time-skipping test server: a draft nobody reviews for three days ends by the run's
 * policy (rejected, or published as drafted) in no wall time; a decision sent after it is refused. Activities run
 * for real against local parts (SQLite files, the offline model).
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { WorkflowUpdateFailedError } from '@temporalio/client';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Registry } from 'prom-client';
import { pipelineMetrics } from '../src/telemetry/metrics';
import { reviewQuery, reviewUpdate } from '../src/workflow';
import {
  installQuietRuntime,
  pipelineInput,
  SAMPLE_TEXT,
  tempParts,
  timeSkippingEnv,
  withPipeline,
} from './helpers';
import { cleanupAfterAll } from './scratch';

const DAY_MINUTES = 24 * 60;

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();

before(async () => {
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
});

describe('a review on the time-skipping server', () => {
  for (const onTimeout of ['reject', 'publish'] as const) {
    it(`ends a draft nobody reviewed in 3 days by its policy: ${onTimeout}`, async () => {
      const local = await tempParts(defer);
      const input = {
        ...(await pipelineInput(local.blobs, SAMPLE_TEXT)),
        review: { timeoutMinutes: 3 * DAY_MINUTES, onTimeout },
      };
      const wallStart = Date.now();
      const result = await withPipeline(env, local, input, async (handle) => {
        // Time stands still until the draft waits: the query answers once the run reached review.
        await env.sleep(1_000);
        const result = await handle.result();
        // A decision after the deadline is refused (the run is closed by now: the server says so).
        await assert.rejects(
          handle.executeUpdate(reviewUpdate, { args: [{ action: 'approve', reviewer: 'late' }] }),
        );
        return result;
      });
      assert.ok(Date.now() - wallStart < 60_000, 'three days of waiting took real time');
      assert.equal(result.review?.outcome, 'expired');
      assert.equal(result.review?.policy, onTimeout);
      assert.ok(
        (result.review?.waitedMs ?? 0) >= 3 * DAY_MINUTES * 60_000,
        `waited ${result.review?.waitedMs} ms`,
      );
      const published = await local.store.countPublications();
      if (onTimeout === 'reject') {
        assert.equal(result.publication, undefined);
        assert.equal(published, 0, 'a rejected draft was published');
      } else {
        assert.equal(result.publication?.revision, 1);
        assert.equal(published, 1);
      }
    });
  }

  it('publishes an edit through the update, recording the reviewer, and refuses a second decision naming the first', async () => {
    const local = await tempParts(defer);
    const input = {
      ...(await pipelineInput(local.blobs, SAMPLE_TEXT)),
      review: { timeoutMinutes: DAY_MINUTES, onTimeout: 'reject' as const },
    };
    let drafted: Record<string, unknown> = {};
    const result = await withPipeline(env, local, input, async (handle) => {
      for (;;) {
        const draft = await handle.query(reviewQuery);
        if (draft !== undefined) {
          drafted = draft.fields;
          break;
        }
        await new Promise((r) => setTimeout(r, 50));
      }
      const outcome = await handle.executeUpdate(reviewUpdate, {
        args: [{ action: 'edit', reviewer: 'ana', fields: { tags: ['checkpoints', 'recovery'] } }],
      });
      assert.equal(outcome.outcome, 'edited');
      await assert.rejects(
        handle.executeUpdate(reviewUpdate, { args: [{ action: 'approve', reviewer: 'bo' }] }),
        (err: unknown) =>
          err instanceof WorkflowUpdateFailedError &&
          /already decided: edited by ana/.test(String(err.cause)),
      );
      return handle.result();
    });
    assert.equal(result.review?.outcome, 'edited');
    assert.equal(result.publication?.revision, 1);
    const stored = await local.store.currentPublication(input.documentId);
    assert.deepEqual(stored?.fields.tags, ['checkpoints', 'recovery'], 'the edit is what was published');
    assert.equal(stored?.fields.summary, drafted.summary, 'a field not edited is published as drafted');
    assert.deepEqual((stored?.fields.review as { reviewer?: string } | undefined)?.reviewer, 'ana');
  });
});

describe('the review in the worker metrics', () => {
  it('counts each decision by outcome and observes its wait in seconds, through the workflow sink', async () => {
    const local = await tempParts(defer);
    const registry = new Registry();
    const deps = { ...local.deps, metrics: pipelineMetrics(registry) };
    const input = {
      ...(await pipelineInput(local.blobs, SAMPLE_TEXT)),
      review: { timeoutMinutes: 2 * 60, onTimeout: 'reject' as const },
    };
    await withPipeline(env, { ...local, deps }, input, (handle) => handle.result());
    const page = await registry.metrics();
    assert.match(page, /^pipeline_review_decisions_total\{outcome="expired"\} 1$/m, page);
    assert.match(page, /^pipeline_review_wait_seconds_count\{outcome="expired"\} 1$/m, page);
    // Two hours of workflow time, and the moment the timer took to fire.
    const waited = Number(
      /^pipeline_review_wait_seconds_sum\{outcome="expired"\} ([\d.]+)$/m.exec(page)?.[1],
    );
    assert.ok(waited >= 7200 && waited < 7260, `waited ${waited} s`);
  });
});
