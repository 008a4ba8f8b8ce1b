/**
 * Replay of committed histories: today's workflow code must reproduce, command for command, every run that
 * yesterday's code recorded. `sequential-*.json` were recorded before summarize and tag ran in parallel (the code
 * with its `patched('parallel-model-steps')` taken as false), `parallel-*.json` after, both with `npm run
 * record-histories`. A change that breaks an open run fails here, not in production; `npm run check-replay` does
 * the same against a server's runs.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { defaultPayloadConverter } from '@temporalio/common';
import { historyFromJSON } from '@temporalio/common/lib/proto-utils';
import type { temporal } from '@temporalio/proto';
import { DefaultLogger, Runtime, Worker } from '@temporalio/worker';
import type { ReplayResult, WorkflowBundle } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { workflowBundle, workflowsWithWorkflowModule } from './helpers';

type History = temporal.api.history.v1.IHistory;
type HistoryEvent = temporal.api.history.v1.IHistoryEvent;

const HISTORIES_DIR = path.join(__dirname, 'histories');
const PATCH_ID = 'parallel-model-steps';

/** Every recorded history whose file name starts with `prefix`, named by its file. */
function loadHistories(prefix = ''): { workflowId: string; history: History }[] {
  return fs
    .readdirSync(HISTORIES_DIR)
    .filter((file) => file.endsWith('.json') && file.startsWith(prefix))
    .sort()
    .map((file) => ({
      workflowId: file,
      history: historyFromJSON(JSON.parse(fs.readFileSync(path.join(HISTORIES_DIR, file), 'utf8'))),
    }));
}

/** The patch IDs recorded by `patched()` calls (core's `core_patch` markers). */
function patchIds(history: History): unknown[] {
  return (history.events ?? [])
    .map((e) => e.markerRecordedEventAttributes)
    .filter((marker) => marker?.markerName === 'core_patch')
    .map((marker) => {
      const payload = marker?.details?.['patch-data']?.payloads?.[0];
      assert.ok(payload, 'a patch marker without patch data');
      return defaultPayloadConverter.fromPayload<{ id: unknown }>(payload).id;
    });
}

/**
 * How the model steps were scheduled: both by one workflow task (parallel), or tag only once summarize had
 * completed, or not at all because summarize failed (sequential).
 */
function modelStepOrder(history: History): 'parallel' | 'sequential' | 'other' {
  const events = history.events ?? [];
  const scheduled = (id: string) =>
    events.find((e) => e.activityTaskScheduledEventAttributes?.activityId === id);
  const summarize = scheduled('summarize');
  const tag = scheduled('tag');
  if (summarize === undefined) return 'other';
  if (tag === undefined) return 'sequential';
  const byTask = (e: HistoryEvent) =>
    String(e.activityTaskScheduledEventAttributes?.workflowTaskCompletedEventId);
  if (byTask(summarize) === byTask(tag)) return 'parallel';
  const summarizeDone = events.find(
    (e) => String(e.activityTaskCompletedEventAttributes?.scheduledEventId) === String(summarize.eventId),
  );
  return Number(summarizeDone?.eventId) < Number(tag.eventId) ? 'sequential' : 'other';
}

async function replayAll(
  bundle: WorkflowBundle,
  histories: { workflowId: string; history: History }[],
): Promise<ReplayResult[]> {
  const results: ReplayResult[] = [];
  for await (const result of Worker.runReplayHistories({ workflowBundle: bundle }, histories)) {
    results.push(result);
  }
  return results;
}

before(() => {
  // A determinism violation is what the last test provokes; the SDK and its native core log it as a warning.
  Runtime.install({
    logger: new DefaultLogger('ERROR'),
    telemetryOptions: { logging: { filter: { core: 'ERROR', other: 'ERROR' } } },
  });
});

describe('replaying recorded histories', () => {
  it('has histories from both sides of the parallel-model-steps patch', () => {
    const sequential = loadHistories('sequential-');
    const parallel = loadHistories('parallel-');
    assert.ok(
      sequential.length >= 1 && parallel.length >= 1,
      'record both sets with npm run record-histories',
    );
    for (const { workflowId, history } of sequential) {
      assert.equal(modelStepOrder(history), 'sequential', workflowId);
      assert.deepEqual(patchIds(history), [], workflowId);
    }
    for (const { workflowId, history } of parallel) {
      assert.equal(modelStepOrder(history), 'parallel', workflowId);
      assert.deepEqual(patchIds(history), [PATCH_ID], workflowId);
    }
  });

  it('replays every history, sequential and parallel, with the current workflow code', async () => {
    const histories = loadHistories();
    const results = await replayAll(await workflowBundle(), histories);

    assert.deepEqual(
      results.map((r) => ({ workflowId: r.workflowId, error: r.error?.message })),
      histories.map(({ workflowId }) => ({ workflowId, error: undefined })),
    );
  });

  describe('the same code with the patch and its old branch deleted', () => {
    let deleted: WorkflowBundle;
    before(async () => {
      deleted = await workflowsWithWorkflowModule(require.resolve('./fixtures/patch-deleted'));
    });

    // Successful sequential runs do not catch it: the early `tag` command is matched to the later
    // ActivityTaskScheduled event. A run whose summarize failed never scheduled tag, and there the extra command
    // meets the WorkflowExecutionFailed event. Resetting such a failed run is exactly when it would be replayed.
    it('fails to replay a sequential run whose summarize failed, with a DeterminismViolationError', async () => {
      const [failed] = loadHistories('sequential-missing-text');
      assert.ok(failed, 'no sequential-missing-text.json: run npm run record-histories');

      await assert.rejects(Worker.runReplayHistory({ workflowBundle: deleted }, failed.history), (err) => {
        assert.ok(
          err instanceof DeterminismViolationError,
          `expected DeterminismViolationError, got ${String(err)}`,
        );
        assert.match(err.message, /Nondeterminism error/);
        return true;
      });
    });

    // The marker a run recorded holds the call in place: without deprecatePatch() first, removing it breaks them.
    it('fails to replay the runs that recorded the marker', async () => {
      const results = await replayAll(deleted, loadHistories('parallel-'));
      assert.ok(results.length >= 1);
      for (const result of results) {
        assert.ok(
          result.error instanceof DeterminismViolationError,
          `${result.workflowId}: ${String(result.error)}`,
        );
        assert.match(result.error.message, new RegExp(`patch marker encountered for change ${PATCH_ID}`));
      }
    });
  });
});
