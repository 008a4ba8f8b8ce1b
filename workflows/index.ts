import { patched } from '@temporalio/workflow';
import type { Steps } from '../activities';
import { runDocument } from '../src/workflow';
import type { PipelineContinuation, PipelineResult, StepActivities, StepResults } from '../src/workflow';

// The batch of documents (npm start's, npm run pipeline's): the kit's, bundled with this pipeline.
export { agentLoop, batch } from '../src/workflow';

/**
 * One document's pipeline: summarize and tag it, then publish (the kit reviews the draft first when the run asks
 * for a review, and waits out a held delivery). Each step is an activity under its own name, so its idempotency
 * key reads `<runId>:summarize`; the event history is the checkpoint, and a finished step never runs again.
 */
export async function documentPipeline(
  rawInput: unknown,
  continuation: PipelineContinuation = {},
): Promise<PipelineResult<StepResults<Steps>>> {
  return runDocument<StepActivities<Steps>, StepResults<Steps>>(rawInput, continuation, async (run) => {
    const { maxSummarySentences, maxTags } = run.input.options;
    const summarize = () => run.step('summarize', { maxSentences: maxSummarySentences });
    const tag = () => run.step('tag', { maxTags });
    // Summarize and tag are independent model calls, so they run side by side. In histories written before
    // this change tag ran after summarize: `patched` is false when such a run is replayed, and it keeps that
    // order. Once `npm run check-replay` finds no open or retained run without the marker, make it
    // `deprecatePatch('parallel-model-steps')` and delete the sequential lines (docs/deploy.md).
    const [summary, tags] = patched('parallel-model-steps')
      ? await Promise.all([summarize(), tag()])
      : [await summarize(), await tag()];
    // An agent: its loop runs only when the run's input turns agent steps on (AGENT=on, docs/agent.md).
    return { summary, tags, related: await run.agent('related', {}) };
  });
}
