/**
 * The benchmark's yardsticks: the pipeline's shape (two steps at once, then one) with activities of no work of
 * their own, so that what a step costs in Temporal alone, on the same server and worker settings, stands beside
 * what it costs in the pipeline. Bundled by scripts/bench/temporal-alone.ts only; no worker of the project runs it.
 */
import { proxyActivities } from '@temporalio/workflow';

const { nothing, busy } = proxyActivities<{ nothing(): Promise<void>; busy(ms: number): Promise<void> }>({
  startToCloseTimeout: '1 minute',
});

/** Three steps that do nothing: summarize and tag finish at once. */
export async function emptySteps(): Promise<void> {
  await Promise.all([nothing(), nothing()]);
  await nothing();
}

/**
 * Three steps of which summarize and tag hold a thread for as long as the model took on one document, and do
 * nothing else: they finish apart, one after the other, as the offline model's do in the pipeline.
 */
export async function busySteps(summarizeMs: number, tagMs: number): Promise<void> {
  await Promise.all([busy(summarizeMs), busy(tagMs)]);
  await nothing();
}
