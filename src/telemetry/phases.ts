/**
 * Opt-in timing of what a step spends where (the text read, the memo's claim and answer, the model call, the
 * publication, the input check), for `npm run bench`'s breakdown of the project's own cost per step. Measured from
 * outside the steps: the phase-timing activity interceptor opens a phase context for each activity execution, and
 * the code that marks a phase records into the current one. Without a context (every worker of the project but
 * the benchmark's) a phase costs one lookup and nothing is recorded.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import type {
  ActivityExecuteInput,
  ActivityInboundCallsInterceptor,
  ActivityInterceptorsFactory,
  Next,
} from '@temporalio/worker';

/** The parts of a step the benchmark tells apart. */
export type Phase = 'input check' | 'text read' | 'memo claim' | 'model call' | 'memo answer' | 'publication';

/** Receives each phase's time, in milliseconds. */
export interface PhaseTimer {
  record(phase: Phase, ms: number): void;
}

const current = new AsyncLocalStorage<PhaseTimer>();

/** Runs `work` in a phase context: the phases it marks, down to its last await, are recorded into `timer`. */
export function timingPhases<T>(timer: PhaseTimer, work: () => T): T {
  return current.run(timer, work);
}

/** Runs `work`, recording its time as `phase` in the current phase context, if there is one. */
export async function timed<T>(phase: Phase, work: () => Promise<T>): Promise<T> {
  const timer = current.getStore();
  if (timer === undefined) return work();
  const started = performance.now();
  try {
    return await work();
  } finally {
    timer.record(phase, performance.now() - started);
  }
}

/** `timed` for synchronous work. */
export function timedSync<T>(phase: Phase, work: () => T): T {
  const timer = current.getStore();
  if (timer === undefined) return work();
  const started = performance.now();
  try {
    return work();
  } finally {
    timer.record(phase, performance.now() - started);
  }
}

/** The activity interceptor that times the phases of every activity execution into `timer` (npm run bench's). */
export function phaseTiming(timer: PhaseTimer): ActivityInterceptorsFactory {
  return () => ({ inbound: new PhaseTiming(timer) });
}

class PhaseTiming implements ActivityInboundCallsInterceptor {
  constructor(private readonly timer: PhaseTimer) {}

  execute(
    input: ActivityExecuteInput,
    next: Next<ActivityInboundCallsInterceptor, 'execute'>,
  ): Promise<unknown> {
    return timingPhases(this.timer, () => next(input));
  }
}
