/**
 * Opt-in timing of what a step spends where (the text read, the memo's claim and answer, the model call, the
 * publication, the input check), for `npm run bench`'s breakdown of the project's own cost per step. Off unless the
 * worker's dependencies carry a PhaseTimer: then a phase costs one `undefined` check and nothing is recorded.
 */

/** The parts of a step the benchmark tells apart. */
export type Phase = 'input check' | 'text read' | 'memo claim' | 'model call' | 'memo answer' | 'publication';

/** Receives each phase's time, in milliseconds. */
export interface PhaseTimer {
  record(phase: Phase, ms: number): void;
}

/** Runs `work`, recording its time as `phase` when there is a timer. */
export async function timed<T>(
  timer: PhaseTimer | undefined,
  phase: Phase,
  work: () => Promise<T>,
): Promise<T> {
  if (timer === undefined) return work();
  const started = performance.now();
  try {
    return await work();
  } finally {
    timer.record(phase, performance.now() - started);
  }
}

/** `timed` for synchronous work. */
export function timedSync<T>(timer: PhaseTimer | undefined, phase: Phase, work: () => T): T {
  if (timer === undefined) return work();
  const started = performance.now();
  try {
    return work();
  } finally {
    timer.record(phase, performance.now() - started);
  }
}
