/**
 * The review queue on the worker's metrics page: a real `npm run worker` process with METRICS_PORT on a dev server,
 * runs that await review, and the page's gauges say how many wait and how long the oldest has (sampled from the
 * server's index, so no run's history carries them). The alert rules in deploy/prometheus/ are test/alert-rules.test.ts's.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { before, describe, it } from 'node:test';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { workflowIdFor } from '../src/contract';
import { reviewQuery } from '../src/workflow';
import { devServerEnv, pipelineInput, SAMPLE_TEXT, startMetricsWorker, tempParts } from './helpers';
import { cleanupAfterAll } from './scratch';

const defer = cleanupAfterAll();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

/** The value of the sample `name` on `page`, or undefined. */
function sampleOf(page: string, name: string): number | undefined {
  const line = new RegExp(`^${name} (\\S+)$`, 'm').exec(page);
  return line?.[1] === undefined ? undefined : Number(line[1]);
}

describe('review gauges', () => {
  it(
    "the worker's metrics page counts the runs awaiting review and how long the oldest has waited",
    { timeout: 180_000 },
    async () => {
      const local = await tempParts(defer);
      const taskQueue = `review-gauges-${randomUUID()}`;
      const { metricsPort } = await startMetricsWorker(defer, env, local.dir, taskQueue, {
        REVIEW_TIMEOUT_HOURS: '2',
      });
      const started = Date.now();
      const handles = [];
      for (let i = 0; i < 3; i++) {
        const input = {
          ...(await pipelineInput(local.blobs, `# Gauge ${i} ${randomUUID()}\n\n${SAMPLE_TEXT}`)),
          review: { timeoutMinutes: 60, onTimeout: 'reject' as const },
        };
        handles.push(
          await env.client.workflow.start('documentPipeline', {
            taskQueue,
            workflowId: workflowIdFor(input.documentId),
            args: [input],
          }),
        );
      }
      // Every draft awaits review (each within 60 s)...
      for (const handle of handles) {
        const deadline = Date.now() + 60_000;
        while ((await handle.query(reviewQuery)) === undefined) {
          if (Date.now() > deadline)
            throw new Error(`${handle.workflowId}'s draft never came to await review`);
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
      }
      // ...and the page says so within two samples (15 s apart) and the index's lag.
      const deadline = Date.now() + 60_000;
      let page = '';
      for (;;) {
        const res = await fetch(`http://127.0.0.1:${metricsPort}/metrics`, {
          signal: AbortSignal.timeout(10_000),
        });
        page = await res.text();
        if (sampleOf(page, 'pipeline_review_awaiting') === 3) break;
        if (Date.now() > deadline)
          throw new Error(`the metrics page never counted 3 runs awaiting review:\n${page.slice(-3_000)}`);
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      assert.match(page, /^# TYPE pipeline_review_awaiting gauge$/m);
      assert.match(page, /^# TYPE pipeline_review_oldest_wait_seconds gauge$/m);
      const oldest = sampleOf(page, 'pipeline_review_oldest_wait_seconds') ?? Number.NaN;
      assert.ok(
        oldest > 0 && oldest <= (Date.now() - started) / 1000 + 5,
        `oldest wait ${oldest} s, with the runs started ${(Date.now() - started) / 1000} s ago`,
      );
      // The deadline the alert compares the wait with: REVIEW_TIMEOUT_HOURS in seconds.
      assert.equal(sampleOf(page, 'pipeline_review_timeout_seconds'), 7_200);
      assert.equal(sampleOf(page, 'pipeline_review_samples_failed_total'), 0);
      await Promise.all(handles.map((handle) => handle.terminate('test over')));
    },
  );
});
