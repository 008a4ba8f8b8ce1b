/** A row of the benchmark's table, and the statistics that fill it. */
import { cpuMs } from './memory';

/** A document of the corpus. */
export interface Doc {
  name: string;
  text: string;
}

/** The pipeline's steps per document: summarize, tag, publish. */
export const STEPS_PER_DOCUMENT = 3;

/** One path at one concurrency: times per document, throughput, and where measured, overhead and history size. */
export interface Row {
  path: string;
  concurrency: number;
  docs: number;
  msPerDocP50: number;
  msPerDocP95: number;
  docsPerSecond: number;
  perStepOverheadMsP50?: number;
  perStepOverheadMsP95?: number;
  historyEventsPerDoc?: number;
  historyBytesPerDoc?: number;
}

/** The `p`th percentile of `values`; NaN when there are none. */
export function percentile(values: readonly number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}

/** `n` rounded to `digits` decimals. */
export const round = (n: number, digits = 1): number => Math.round(n * 10 ** digits) / 10 ** digits;

/** A row of a loop outside Temporal: one document at a time. */
export function loopRow(name: string, perDoc: readonly number[], seconds: number): Row {
  return {
    path: name,
    concurrency: 1,
    docs: perDoc.length,
    msPerDocP50: round(percentile(perDoc, 50), 2),
    msPerDocP95: round(percentile(perDoc, 95), 2),
    docsPerSecond: round(perDoc.length / seconds),
  };
}

/** A row of documents run through Temporal: each one's time and its per-step overhead, and `seconds` for all. */
export function timedRow(
  name: string,
  concurrency: number,
  perDoc: readonly number[],
  overhead: readonly number[],
  seconds: number,
): Row {
  return {
    path: name,
    concurrency,
    docs: perDoc.length,
    msPerDocP50: round(percentile(perDoc, 50)),
    msPerDocP95: round(percentile(perDoc, 95)),
    docsPerSecond: round(perDoc.length / seconds),
    perStepOverheadMsP50: round(percentile(overhead, 50)),
    perStepOverheadMsP95: round(percentile(overhead, 95)),
  };
}

/** The Temporal server whose CPU atOnce reads beside this process's (see lastSpanCpuMs). */
let watchedServer: number | undefined;
let lastSpan: { bench: number; server: number } | undefined;

/** From now on, atOnce reads this process's CPU too (the Temporal server's). */
export function watchServerCpu(pid: number | undefined): void {
  watchedServer = pid;
}

/**
 * The CPU the latest atOnce took, in ms: this process's (every thread of it) and the watched server's (NaN where
 * none is watched). Only the span of the documents' runs, not a worker's start or a history's fetch after it.
 */
export function lastSpanCpuMs(): { bench: number; server: number } | undefined {
  return lastSpan;
}

/** Runs `work(i)` for each i below `count`, `concurrency` at a time, in order; returns the seconds it all took. */
export async function atOnce(
  count: number,
  concurrency: number,
  work: (i: number) => Promise<void>,
): Promise<number> {
  let next = 0;
  const server = () => (watchedServer === undefined ? Number.NaN : (cpuMs(watchedServer) ?? Number.NaN));
  const cpu = [process.cpuUsage(), server()] as const;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < count; i = next++) await work(i);
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu[0]);
  lastSpan = { bench: (used.user + used.system) / 1000, server: server() - cpu[1] };
  return seconds;
}
