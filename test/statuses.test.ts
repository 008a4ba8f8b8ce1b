/**
 * Honest statuses: a publication the target answered as superseded (a newer run of the document had published
 * first, so this one was not written) is its own status in the result table, the report and the exit code.
 */
import '../src/cli/compose';
import assert from 'node:assert/strict';
import path from 'node:path';
import { before, describe, it } from 'node:test';
import type { PublishInput } from '../src/contract';
import type { PipelineResult } from '../src/cli/compose';
import { SqlitePublicationStore } from '../src/publisher/publication-store';
import type { PublicationStore } from '../src/publisher/publication-store';
import { formatReport } from '../src/runs/report-format';
import { documentStatus, exitCodeFor, printOutcomes } from '../src/runs/result-table';
import type { DocumentOutcome } from '../src/runs/result-table';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();

const modelFields = {
  model: { provider: 'offline', model: 'extractive-wink-nlp' },
  usage: { inputTokens: 10, outputTokens: 2 },
  memoised: false,
  estimatedCostUsd: 0,
} as const;

/** A finished run's outcome whose publish receipt is what the real store answered for `scheduledAt`. */
async function outcomeFor(
  store: PublicationStore,
  runId: string,
  scheduledAt: number,
): Promise<DocumentOutcome> {
  const publication: PublishInput = {
    documentId: 'notes',
    title: 'Notes',
    textRef: `sha256:${'a'.repeat(64)}`,
    summary: 'A summary.',
    tags: ['notes'],
    model: modelFields.model,
    scheduledAt,
  };
  const receipt = await store.publish(publication, `${runId}:publish`);
  const result: PipelineResult = {
    documentId: 'notes',
    title: 'Notes',
    summary: { summary: 'A summary.', idempotencyKey: `${runId}:summarize`, ...modelFields },
    tags: { tags: ['notes'], idempotencyKey: `${runId}:tag`, ...modelFields },
    publication: { ...receipt, idempotencyKey: `${runId}:publish`, target: 'sqlite' },
  };
  return {
    source: `${runId}.md`,
    title: 'Notes',
    workflowId: 'document-notes',
    result,
    error: undefined,
    report: undefined,
  };
}

describe('a superseded publication', () => {
  const store = new SqlitePublicationStore(path.join(scratchDir(defer), 'publications.db'));
  defer(() => store.close());
  let newer: DocumentOutcome;
  let older: DocumentOutcome;
  before(async () => {
    newer = await outcomeFor(store, 'run-new', 2_000);
    older = await outcomeFor(store, 'run-old', 1_000);
  });

  it('is its own status and exit code, never "published"', () => {
    assert.equal(documentStatus(newer), 'published');
    assert.equal(documentStatus(older), 'superseded');
    assert.equal(exitCodeFor([newer]), 0);
    assert.equal(exitCodeFor([newer, older]), 3);
    assert.equal(exitCodeFor([older, { ...newer, result: undefined, error: 'boom' }]), 1);
  });

  it('is shown as superseded in the result table and counted apart', () => {
    const lines: string[] = [];
    printOutcomes([newer, older], (line) => lines.push(line));
    const rows = lines.filter((l) => l.startsWith('Notes'));
    assert.match(rows[0] ?? '', /published r1/);
    assert.match(rows[1] ?? '', /SUPERSEDED by r1/);
    assert.doesNotMatch(rows[1] ?? '', /published/);
    assert.ok(
      lines.includes('1 of 2 document(s) published, 1 superseded by a newer run (not written), 0 failed.'),
    );
    assert.ok(lines.some((l) => l.startsWith('SUPERSEDED run-old.md')));
  });

  it('is reported as superseded by the report command', () => {
    const report = { runId: 'run-old', steps: [], workers: [] };
    const outcome = { status: 'completed' as const, startedAt: 0, closedAt: 1_000, failure: undefined };
    const lines = formatReport('document-notes', report, {
      outcome,
      takeovers: [],
      identities: [],
      publication: { revision: 1, duplicate: false, superseded: true },
    });
    assert.match(lines[1] ?? '', /SUPERSEDED: a newer run had already published revision 1/);
    assert.doesNotMatch(lines[1] ?? '', /published as revision/);
  });
});
