/**
 * The throughput fraction in rounds. The pipeline's best rate and the ceiling's two parts (Temporal alone's best,
 * the busy yardstick's best, the model's time a document) are each a run of its own, and this machine's speed
 * drifts by a third between runs minutes apart, so a fraction of two such runs says more of the drift than of
 * the pipeline. Here each round runs every one of them back to back, in an order that turns with each round, and
 * takes the fraction within the round; the figure is the median over the rounds.
 */
import os from 'node:os';
import { lastSpanCpuMs, percentile, round, watchServerCpu } from './rows';

/** What one round measured, and the fraction within it. */
export interface ThroughputRound {
  /** docs/s: the pipeline's best over the concurrencies, Temporal alone's, the busy yardstick's. */
  pipeline: number;
  noOpYardstick: number;
  busyYardstick: number;
  /** The model's mean time a document in the plain loop. */
  modelMsPerDoc: number;
  /** 1 / (1 / noOpYardstick + modelMsPerDoc / cores) */
  modelledCeiling: number;
  /** The higher of the modelled ceiling and the busy yardstick. */
  ceiling: number;
  fraction: number;
  /**
   * CPU a document in each path's best run: the bench process (its worker, client and threads: the model's, the
   * yardstick's) and the Temporal server. Where the pipeline's sum exceeds the busy yardstick's is what its own
   * code costs both cores, the server's share included (larger histories, more commands).
   */
  cpuMsPerDoc: Partial<
    Record<'pipeline' | 'noOpYardstick' | 'busyYardstick', { bench: number; server: number }>
  >;
}

/** One path's rate at `concurrency`, in the round numbered `round` (for workflow IDs of their own). */
type Rate = (concurrency: number, round: number) => Promise<number>;

/** `count` documents through each path; `serverPid` the Temporal server's process, whose CPU is read too. */
export async function throughputRounds(
  paths: { pipeline: Rate; noOpYardstick: Rate; busyYardstick: Rate; modelMsPerDoc: () => Promise<number> },
  concurrencies: readonly number[],
  rounds: number,
  count: number,
  serverPid: number | undefined,
): Promise<{ rounds: ThroughputRound[]; fractionP50: number; ceilingP50: number; pipelineP50: number }> {
  const measured: ThroughputRound[] = [];
  watchServerCpu(serverPid);
  for (let r = 0; r < rounds; r++) {
    const rates = { pipeline: 0, noOpYardstick: 0, busyYardstick: 0 };
    const cpuMsPerDoc: ThroughputRound['cpuMsPerDoc'] = {};
    let modelMsPerDoc = 0;
    const steps: Array<() => Promise<void>> = [
      ...(['pipeline', 'noOpYardstick', 'busyYardstick'] as const).map((name) => async () => {
        for (const concurrency of concurrencies) {
          const rate = await paths[name](concurrency, r);
          const span = lastSpanCpuMs();
          if (rate <= rates[name] || span === undefined) continue;
          rates[name] = rate;
          cpuMsPerDoc[name] = { bench: round(span.bench / count, 2), server: round(span.server / count, 2) };
        }
      }),
      async () => {
        modelMsPerDoc = await paths.modelMsPerDoc();
      },
    ];
    // Each round starts one further along the list, so no path is always first (or always after the same one).
    for (let k = 0; k < steps.length; k++) await steps[(r + k) % steps.length]?.();
    const modelledCeiling = 1 / (1 / rates.noOpYardstick + modelMsPerDoc / 1000 / os.cpus().length);
    const ceiling = Math.max(modelledCeiling, rates.busyYardstick);
    measured.push({
      ...rates,
      modelMsPerDoc: round(modelMsPerDoc, 2),
      modelledCeiling: round(modelledCeiling),
      ceiling: round(ceiling),
      fraction: round(rates.pipeline / ceiling, 2),
      cpuMsPerDoc,
    });
  }
  return {
    rounds: measured,
    fractionP50: round(
      percentile(
        measured.map((m) => m.fraction),
        50,
      ),
      2,
    ),
    ceilingP50: round(
      percentile(
        measured.map((m) => m.ceiling),
        50,
      ),
    ),
    pipelineP50: round(
      percentile(
        measured.map((m) => m.pipeline),
        50,
      ),
    ),
  };
}
