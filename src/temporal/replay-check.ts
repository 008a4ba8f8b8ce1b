/**
 * What `npm run check-replay` does: replays the histories of a server's open and retained runs against the working
 * tree's workflow code, and tells which runs would break and which `patched()` branches some run still needs.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Client } from '@temporalio/client';
import { defaultPayloadConverter } from '@temporalio/common';
import type { DataConverter } from '@temporalio/common';
import type { temporal } from '@temporalio/proto';
import { bundleWorkflowCode, Worker } from '@temporalio/worker';
import type { InjectedSinks, WorkflowBundle } from '@temporalio/worker';
import type { PatchProbeSinks } from './patch-probe';

type History = temporal.api.history.v1.IHistory;

/** A run as the check names it. */
export interface RunRef {
  workflowId: string;
  runId: string;
  /** The server's word for it: Running, Completed, Failed, ... */
  status: string;
}

/** A run whose history today's code cannot replay, and the replay's reason. */
export interface BrokenRun extends RunRef {
  reason: string;
}

/** One `patched()` (or `deprecatePatch()`) call of the workflow code, and the runs that still depend on it. */
export interface PatchUse {
  patchId: string;
  call: 'patched' | 'deprecatePatch';
  /** Runs whose history passed the call without the marker: they replay only through the old branch. */
  oldBranch: RunRef[];
  /** Runs whose history holds the marker, not deprecated: they replay only while the call is there. */
  marked: RunRef[];
}

export interface ReplayCheck {
  replayed: number;
  broken: BrokenRun[];
  patches: PatchUse[];
}

/** The kit's workflow side (src/workflow/), bundled with every pipeline's workflows: its patches count too. */
const KIT_WORKFLOW_DIR = path.join(__dirname, '..', 'workflow');

/**
 * The patch IDs the workflow code names, with the call that names them (string literals only): the workflows'
 * folder and the kit's workflow side, which the bundle holds with them.
 */
export function patchCallsIn(workflowsPath: string): { patchId: string; call: PatchUse['call'] }[] {
  const dir = fs.statSync(workflowsPath).isDirectory() ? workflowsPath : path.dirname(workflowsPath);
  const found = new Map<string, PatchUse['call']>();
  const entries = [dir, KIT_WORKFLOW_DIR].flatMap((folder) =>
    fs.existsSync(folder) ? fs.readdirSync(folder, { withFileTypes: true, recursive: true }) : [],
  );
  for (const entry of entries) {
    if (!entry.isFile() || !/\.[cm]?[jt]s$/.test(entry.name)) continue;
    const source = fs.readFileSync(path.join(entry.parentPath, entry.name), 'utf8');
    for (const [, call, , patchId] of source.matchAll(
      /\b(patched|deprecatePatch)\(\s*(['"`])([^'"`]+)\2\s*\)/g,
    )) {
      if (patchId !== undefined && (call === 'patched' || call === 'deprecatePatch'))
        found.set(patchId, call);
    }
  }
  return [...found].map(([patchId, call]) => ({ patchId, call }));
}

/**
 * The workflow code at `workflowsPath`, bundled fresh with patch-probe.ts standing in for `@temporalio/workflow`, and
 * the data converter's own modules (a failure converter, say), as a worker would bundle it.
 */
export async function bundleForCheck(
  workflowsPath: string,
  dataConverter: DataConverter | undefined,
): Promise<WorkflowBundle> {
  const quiet = (): void => {};
  return bundleWorkflowCode({
    workflowsPath,
    logger: { trace: quiet, debug: quiet, info: quiet, warn: quiet, error: quiet, log: quiet },
    ...(dataConverter?.payloadConverterPath
      ? { payloadConverterPath: dataConverter.payloadConverterPath }
      : {}),
    ...(dataConverter?.failureConverterPath
      ? { failureConverterPath: dataConverter.failureConverterPath }
      : {}),
    webpackConfigHook: (config) => ({
      ...config,
      resolve: {
        ...config.resolve,
        alias: { ...config.resolve?.alias, '@temporalio/workflow$': require.resolve('./patch-probe') },
      },
    }),
  });
}

/** The visibility query for the runs to check: the task queue's open runs and those closed after `since`. */
export function runsQuery(taskQueue: string, since: Date): string {
  const quoted = taskQueue.replace(/'/g, "\\'");
  return `TaskQueue = '${quoted}' AND (ExecutionStatus = 'Running' OR CloseTime > '${since.toISOString()}')`;
}

/** How long the namespace keeps closed runs (their histories, and so their queries), in ms; undefined if unset. */
export async function namespaceRetentionMs(client: Client): Promise<number | undefined> {
  const { config } = await client.workflowService.describeNamespace({ namespace: client.options.namespace });
  const ttl = config?.workflowExecutionRetentionTtl;
  const ms = Number(ttl?.seconds ?? 0) * 1000 + Math.round((ttl?.nanos ?? 0) / 1e6);
  return ms > 0 ? ms : undefined;
}

/**
 * Lists the runs the query finds, downloads each history and replays it against `bundle`, one at a time (the
 * replay worker takes them in order, so what the probe reports belongs to the run being replayed).
 */
export async function checkRuns(
  client: Client,
  options: {
    query: string;
    bundle: WorkflowBundle;
    patchCalls: { patchId: string; call: PatchUse['call'] }[];
    dataConverter?: DataConverter | undefined;
  },
): Promise<ReplayCheck> {
  const patches = options.patchCalls.map((p): PatchUse => ({ ...p, oldBranch: [], marked: [] }));
  const byId = new Map(patches.map((p) => [p.patchId, p]));
  let current: RunRef | undefined;
  const refs: RunRef[] = [];

  async function* histories(): AsyncIterable<{ workflowId: string; history: History }> {
    for await (const run of client.workflow.list({ query: options.query })) {
      const ref = { workflowId: run.workflowId, runId: run.runId, status: run.status.name };
      const history = await client.workflow.getHandle(run.workflowId, run.runId).fetchHistory();
      for (const marker of patchMarkers(history)) {
        if (!marker.deprecated) byId.get(marker.patchId)?.marked.push(ref);
      }
      current = ref;
      refs.push(ref);
      yield { workflowId: run.workflowId, history };
    }
  }

  // A `patched()` call may be made again by later activations of the same run: count each run once per patch.
  const tookOld = new Set<string>();
  const sinks: InjectedSinks<PatchProbeSinks> = {
    patchProbe: {
      patched: {
        fn: (_info, patchId, taken) => {
          const use = byId.get(patchId);
          if (taken || use === undefined || current === undefined) return;
          const key = `${patchId}\u0000${current.workflowId}\u0000${current.runId}`;
          if (tookOld.has(key)) return;
          tookOld.add(key);
          use.oldBranch.push(current);
        },
        callDuringReplay: true,
      },
    },
  };

  const broken: BrokenRun[] = [];
  let replayed = 0;
  const replays = Worker.runReplayHistories(
    {
      workflowBundle: options.bundle,
      sinks,
      dataConverter: options.dataConverter,
      replayName: 'check-replay',
    },
    histories(),
  );
  for await (const result of replays) {
    const ref = refs[replayed++];
    if (ref !== undefined && result.error !== undefined) {
      broken.push({ ...ref, reason: reasonOf(result.error) });
    }
  }
  return { replayed, broken, patches };
}

/** The core_patch markers a history recorded (what `patched()` and `deprecatePatch()` write). */
export function patchMarkers(history: History): { patchId: string; deprecated: boolean }[] {
  return (history.events ?? []).flatMap((event) => {
    const marker = event.markerRecordedEventAttributes;
    const payload =
      marker?.markerName === 'core_patch' ? marker.details?.['patch-data']?.payloads?.[0] : undefined;
    if (payload === undefined) return [];
    const data = defaultPayloadConverter.fromPayload<{ id?: unknown; deprecated?: unknown }>(payload);
    return typeof data.id === 'string' ? [{ patchId: data.id, deprecated: data.deprecated === true }] : [];
  });
}

/** The replay failure in one line: the SDK's sentence and core's reason, without the wrapper's Rust dump. */
function reasonOf(error: Error): string {
  const core = /message: "([^"]*)"/.exec(error.message)?.[1];
  const first = error.message.split('. ')[0] ?? error.message;
  return core !== undefined ? `${error.name}: ${core}` : `${error.name}: ${first}`;
}

/** What the check found, as the lines `npm run check-replay` prints. */
export function describeCheck(check: ReplayCheck, shown = 5): string[] {
  const run = (r: RunRef) => `${r.workflowId} (run ${r.runId}, ${r.status.toLowerCase()})`;
  const some = (runs: RunRef[]) =>
    runs.slice(0, shown).map(run).join(', ') +
    (runs.length > shown ? `, and ${runs.length - shown} more` : '');
  const count = (n: number) => (n === 1 ? '1 run' : `${n} runs`);
  const lines = check.broken.map((r) => `BREAKS ${run(r)}: ${r.reason}`);
  lines.push(
    check.broken.length === 0
      ? `${count(check.replayed)} replayed, none would break.`
      : `${count(check.replayed)} replayed, ${count(check.broken.length)} would break: deploy this code only ` +
          'once they are closed and past retention, or guard the change with patched() (docs/deploy.md).',
  );
  for (const p of check.patches) {
    const name = `${p.call}('${p.patchId}')`;
    if (p.call === 'patched' && p.oldBranch.length > 0) {
      lines.push(
        `${name}: still needed, ${count(p.oldBranch.length)} took the old branch: ${some(p.oldBranch)}.`,
      );
    } else if (p.call === 'patched' && p.marked.length > 0) {
      lines.push(
        `${name}: no run needs the old branch; ${count(p.marked.length)} recorded the marker: replace it with ` +
          `deprecatePatch('${p.patchId}') and delete the old branch, then remove the call once they are gone.`,
      );
    } else if (p.call === 'patched') {
      lines.push(`${name}: no longer needed, no run took the old branch or recorded the marker: remove it.`);
    } else if (p.marked.length > 0) {
      lines.push(`${name}: still needed, ${count(p.marked.length)} recorded the marker: ${some(p.marked)}.`);
    } else {
      lines.push(`${name}: no longer needed, no run recorded the marker undeprecated: remove the call.`);
    }
  }
  return lines;
}
