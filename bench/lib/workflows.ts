/**
 * The benchmark's yardsticks: the pipeline's shape (two steps at once, then one) with activities of no work of
 * their own, so that what a step costs in Temporal alone, on the same server and worker settings, stands beside
 * what it costs in the pipeline. Bundled by bench/lib/temporal-alone.ts only; no worker of the project runs it.
 */
import { patched, proxyActivities } from '@temporalio/workflow';

const { nothing, busy } = proxyActivities<{
  nothing(): Promise<void>;
  busy(name: string, step: 'summarize' | 'tag'): Promise<void>;
}>({
  startToCloseTimeout: '1 minute',
});

/** Three steps that do nothing: summarize and tag finish at once. */
export async function emptySteps(): Promise<void> {
  await Promise.all([nothing(), nothing()]);
  await nothing();
}

/**
 * Three steps of which summarize and tag are the model's scoring of one document on a thread, and do nothing else:
 * they finish apart, one after the other, as the offline model's do in the pipeline.
 */
export async function busySteps(name: string): Promise<void> {
  await Promise.all([busy(name, 'summarize'), busy(name, 'tag')]);
  await nothing();
}

/**
 * The no-op yardstick with the pipeline's one patch: the same `patched('parallel-model-steps')` call before the
 * steps, so its marker and the search-attribute upsert the SDK adds for it are in the run, as in every new pipeline
 * run. The difference from emptySteps before the first step is scheduled is what Temporal charges a run for
 * carrying the patch.
 */
export async function emptyStepsPatched(): Promise<void> {
  if (!patched('parallel-model-steps'))
    throw new Error('a new run took the branch of runs recorded before the patch');
  await emptySteps();
}
