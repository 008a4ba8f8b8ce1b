/**
 * The benchmark's yardstick: the pipeline's shape (two steps at once, then one) with activities that do nothing,
 * so that what a step costs in Temporal alone, on the same server and worker settings, stands beside what it
 * costs in the pipeline. Bundled by scripts/bench/temporal-alone.ts only; no worker of the project runs it.
 */
import { proxyActivities } from '@temporalio/workflow';

const { nothing } = proxyActivities<{ nothing(): Promise<void> }>({ startToCloseTimeout: '1 minute' });

export async function emptySteps(): Promise<void> {
  await Promise.all([nothing(), nothing()]);
  await nothing();
}
