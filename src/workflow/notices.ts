import { getExternalWorkflowHandle, setHandler, workflowInfo } from '@temporalio/workflow';
import type { SignalDefinition } from '@temporalio/workflow';
import { PUBLISH_STEP } from '../contract/plain';
import type { PipelineProgress } from '../contract/plain';
import { budgetWaitSignal, deliveryHeldSignal, noticesWantedSignal } from './queries';

/**
 * Tells the run's batches how it stands: its parent, and batches that attached to it while it was under way
 * (noticesWantedSignal). A batch may have ended or continued meanwhile: telling it is a courtesy, never a reason
 * to fail.
 */
export class BatchNotices {
  private readonly watchers: Set<string>;

  constructor(progress: PipelineProgress, watchers: readonly string[]) {
    this.watchers = new Set(watchers);
    setHandler(noticesWantedSignal, async ({ workflowId }) => {
      if (workflowId === workflowInfo().parent?.workflowId) return;
      this.watchers.add(workflowId);
      // The batch attached after this run told its own: it hears how the run stands now.
      const self = workflowInfo().workflowId;
      if (progress.heldKey !== undefined && progress.steps[PUBLISH_STEP] === 'held')
        await signalBatch(workflowId, deliveryHeldSignal, { workflowId: self, heldKey: progress.heldKey });
      if (progress.budgetId !== undefined)
        await signalBatch(workflowId, budgetWaitSignal, { workflowId: self, budgetId: progress.budgetId });
    });
  }

  /** The batches that attached, to carry across continue-as-new. */
  watching(): string[] {
    return [...this.watchers];
  }

  async tell<A>(signal: SignalDefinition<[A]>, notice: A): Promise<void> {
    const parent = workflowInfo().parent;
    const batches = [...(parent === undefined ? [] : [parent.workflowId]), ...this.watchers];
    await Promise.all(batches.map((workflowId) => signalBatch(workflowId, signal, notice)));
  }
}

async function signalBatch<A>(workflowId: string, signal: SignalDefinition<[A]>, notice: A): Promise<void> {
  await getExternalWorkflowHandle(workflowId)
    .signal(signal, notice)
    .catch(() => undefined);
}
