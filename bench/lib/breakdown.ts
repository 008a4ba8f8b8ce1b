/**
 * Where a step's own time goes: the phases the activities mark (src/telemetry/phases.ts), each run's history split
 * into workflow-task and activity time, and what the per-step work that no timer sees costs when done alone (the
 * payload codec, a span with no exporter).
 */
import { randomBytes } from 'node:crypto';
import { temporal } from '@temporalio/proto';
import type { Phase, PhaseTimer } from '../../src/telemetry/phases';
import { AesGcmCodec } from '../../src/temporal/codec';
import { inSpan } from '../../src/telemetry/spans';
import { defaultPayloadConverter } from '@temporalio/common';
import { Worker } from '@temporalio/worker';
import type { WorkerOptions } from '@temporalio/worker';
import { percentile, round } from './rows';

/** A PhaseTimer that keeps every time it is given, until `reset`. */
export class PhaseRecorder implements PhaseTimer {
  private times = new Map<Phase, number[]>();

  record(phase: Phase, ms: number): void {
    const list = this.times.get(phase) ?? [];
    list.push(ms);
    this.times.set(phase, list);
  }

  reset(): void {
    this.times = new Map();
  }

  /** Each phase's total over `docs` documents, per document and per step (a mean), and its p50 per occurrence. */
  summary(
    docs: number,
    stepsPerDoc: number,
  ): Record<string, { msPerStep: number; p50Ms: number; count: number }> {
    const out: Record<string, { msPerStep: number; p50Ms: number; count: number }> = {};
    for (const [phase, list] of this.times) {
      const total = list.reduce((a, b) => a + b, 0);
      out[phase] = {
        msPerStep: round(total / docs / stepsPerDoc, 3),
        p50Ms: round(percentile(list, 50), 3),
        count: list.length,
      };
    }
    return out;
  }
}

/** One run's history, split: time inside workflow tasks (started to completed) and inside activities, and events. */
export interface HistorySplit {
  workflowTaskMs: number;
  activityMs: number;
  events: number;
}

const { EventType } = temporal.api.enums.v1;

/** An event's time as the server wrote it (its clock, its rounding: tenths of a millisecond), in epoch ms. */
export function eventMs(e: temporal.api.history.v1.IHistoryEvent | undefined): number | undefined {
  const t = e?.eventTime;
  return t ? Number(t.seconds ?? 0) * 1000 + (t.nanos ?? 0) / 1e6 : undefined;
}

/** Splits `history` by the event times the server wrote. */
export function splitHistory(history: temporal.api.history.v1.IHistory): HistorySplit {
  const events = history.events ?? [];
  const ms = (e: (typeof events)[number]): number => eventMs(e) ?? 0;
  const startedAt = new Map<number, number>();
  let workflowTaskMs = 0;
  let activityMs = 0;
  let taskStarted: number | undefined;
  for (const e of events) {
    const type = e.eventType;
    if (type === EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED) taskStarted = ms(e);
    if (type === EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED && taskStarted !== undefined)
      workflowTaskMs += ms(e) - taskStarted;
    if (type === EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
      startedAt.set(Number(e.activityTaskStartedEventAttributes?.scheduledEventId), ms(e));
    if (type === EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) {
      const started = startedAt.get(Number(e.activityTaskCompletedEventAttributes?.scheduledEventId));
      if (started !== undefined) activityMs += ms(e) - started;
    }
  }
  return { workflowTaskMs, activityMs, events: events.length };
}

/** p50s over many runs' splits. */
export function splitSummary(
  histories: readonly temporal.api.history.v1.IHistory[],
  replayMsPerDoc: number,
): {
  workflowTaskMsPerDocP50: number;
  activityMsPerDocP50: number;
  eventsPerDoc: number;
  replayMsPerDoc: number;
} {
  const splits = histories.map(splitHistory);
  return {
    replayMsPerDoc,
    workflowTaskMsPerDocP50: round(
      percentile(
        splits.map((s) => s.workflowTaskMs),
        50,
      ),
    ),
    activityMsPerDocP50: round(
      percentile(
        splits.map((s) => s.activityMs),
        50,
      ),
    ),
    eventsPerDoc: round(splits.reduce((a, s) => a + s.events, 0) / Math.max(1, splits.length)),
  };
}

/**
 * Milliseconds a run to replay `histories` with `bundle`: the workflow code's own work in the sandbox (activations,
 * its payloads, its commands), with no server, no activity and no wait in it.
 */
export async function replayMsPerRun(
  bundle: NonNullable<WorkerOptions['workflowBundle']>,
  histories: readonly temporal.api.history.v1.IHistory[],
): Promise<number> {
  const started = performance.now();
  const replays = Worker.runReplayHistories(
    { workflowBundle: bundle, replayName: 'bench-replay' },
    histories.map((history, i) => ({ workflowId: `bench-replay-${i}`, history })),
  );
  for await (const result of replays) if (result.error !== undefined) throw result.error;
  return round((performance.now() - started) / Math.max(1, histories.length), 2);
}

/** Mean microseconds per call of `fn`, over `rounds` calls after a warm-up. */
async function microseconds(rounds: number, fn: () => unknown): Promise<number> {
  for (let i = 0; i < Math.min(200, rounds); i++) await fn();
  const started = performance.now();
  for (let i = 0; i < rounds; i++) await fn();
  return round(((performance.now() - started) * 1000) / rounds, 1);
}

/**
 * What a step's work outside the timed phases costs alone, in microseconds per step: sealing and opening its
 * payloads (when PAYLOAD_ENCRYPTION_KEY is set; the bench's worker runs without, as the yardstick does), a span
 * when no exporter is configured (no tracer provider: the OpenTelemetry API's no-op).
 */
export async function microCosts(sampleResult: unknown): Promise<Record<string, number>> {
  const key = randomBytes(32);
  const codec = new AesGcmCodec({ current: { id: 'bench', key }, keys: new Map([['bench', key]]) });
  const payload = defaultPayloadConverter.toPayload(sampleResult);
  // A step's payloads: its input on the way in, its result on the way out, each sealed once and opened once.
  const codecUs = await microseconds(2000, async () => {
    const sealed = await codec.encode([payload, payload]);
    await codec.decode(sealed);
  });
  const spanUs = await microseconds(20000, () =>
    inSpan('model call', { 'pipeline.step': 'bench' }, async () => 1),
  );
  return {
    payloadCodecUsPerStep: codecUs,
    spanWithoutExporterUsPerCall: spanUs,
    payloadBytes: payload.data?.length ?? 0,
  };
}
