/**
 * Starting over: `--rerun` is parsed (and a mistyped option refused), and the result table says which results
 * were produced earlier and by which model, suggesting --rerun when the workers now use another one.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseRunArgs } from '../src/cli/args';
import { ConfigError } from '../src/config';
import type { ModelInfo, PipelineResult } from '../src/contract';
import { printOutcomes } from '../src/runs/result-table';
import type { DocumentOutcome } from '../src/runs/result-table';

function outcome(title: string, model: ModelInfo, doneEarlier: boolean): DocumentOutcome {
  const usage = { inputTokens: 10, outputTokens: 2 };
  const result: PipelineResult = {
    documentId: title,
    title,
    summary: { summary: 'S.', idempotencyKey: 'r:summarize', model, usage, memoised: false },
    tags: { tags: ['t'], idempotencyKey: 'r:tag', model, usage, memoised: false },
    publication: {
      idempotencyKey: 'r:publish',
      target: 'sqlite',
      documentId: title,
      revision: 1,
      duplicate: false,
    },
  };
  const steps = (['summarize', 'tag', 'publish'] as const).map((step) => ({
    step,
    status: 'completed' as const,
    attempts: 1,
    worker: 'w',
    lastFailure: undefined,
    idempotencyKey: `r:${step}`,
    scheduledAt: 1,
    completedAt: 2,
    timeLostMs: 0,
    skippedOnResume: false,
    doneEarlier,
    memoised: false,
    usage: undefined,
    estimatedCostUsd: undefined,
  }));
  return {
    source: `${title}.md`,
    title,
    workflowId: `document-${title}`,
    result,
    error: undefined,
    report: { runId: 'r', steps, workers: ['w'] },
  };
}

const offline = { provider: 'offline', model: 'extractive-wink-nlp' };
const haiku = { provider: 'anthropic', model: 'claude-haiku-4-5' };

describe('--rerun', () => {
  it('is an option among the paths, and a mistyped one is refused with the options there are', () => {
    assert.deepEqual(parseRunArgs(['notes/', '--rerun', 'a.md']), { paths: ['notes/', 'a.md'], rerun: true });
    assert.deepEqual(parseRunArgs(['notes/']), { paths: ['notes/'], rerun: false });
    assert.throws(
      () => parseRunArgs(['--re-run']),
      (err: unknown) => {
        assert.ok(err instanceof ConfigError);
        assert.match(err.message, /unknown option --re-run; the options are --rerun/);
        return true;
      },
    );
  });
});

describe('the result table on results produced earlier', () => {
  it('marks them, names their model, and suggests --rerun when the workers use another model now', () => {
    const lines: string[] = [];
    printOutcomes([outcome('old', offline, true), outcome('new', haiku, false)], (l) => lines.push(l), {
      columns: 120,
      configuredModel: haiku,
    });
    const log = lines.join('\n');
    assert.match(lines.find((l) => l.startsWith('old')) ?? '', /published r1, earlier\s+offline/);
    assert.match(lines.find((l) => l.startsWith('new')) ?? '', /published r1\s+anthropic\/claude-haiku-4-5/);
    assert.match(log, /1 result\(s\) were produced earlier, not in this session/);
    assert.match(
      log,
      /Those were made by offline, and the workers are now configured with anthropic\/claude-haiku-4-5: add --rerun/,
    );
  });

  it('does not suggest --rerun when the earlier results came from the configured model', () => {
    const lines: string[] = [];
    printOutcomes([outcome('old', offline, true)], (l) => lines.push(l), { configuredModel: offline });
    assert.doesNotMatch(lines.join('\n'), /add --rerun/);
  });
});
