/**
 * The agent step (docs/agent.md) on the time-skipping server: the related step's loop of turns and tool calls,
 * with the offline model's scripted planner and the demo's cross-reference receiver over HTTP.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { startTracing } from '../src/telemetry/tracing';
import { ManifestWriter } from '../src/documents/manifest';
import { formatCost, formatTokens } from '../src/model/pricing';
import { agentLines } from '../src/runs/agent-lines';
import type { AgentSettings } from '../src/contract';
import { startCrossReferenceServer } from '../demo/cross-reference-server';
import type { CrossReferenceServer } from '../demo/cross-reference-server';
import {
  installQuietRuntime,
  pipelineInput,
  SAMPLE_TEXT,
  modelServerFor,
  tempParts,
  timeSkippingEnv,
  withPipeline,
} from './helpers';
import type { LocalParts } from './helpers';
import { cleanupAfterAll } from './scratch';
import { plannedTurn } from './agent-model';

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();
// The activities' spans, in this process: a span per turn and per tool call.
const spans = new InMemorySpanExporter();
startTracing(new SimpleSpanProcessor(spans));

before(async () => {
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
});

const OTHERS = [
  {
    title: 'Checkpoints in practice',
    text: 'Checkpoints let a restarted worker skip finished steps. Durable checkpoints matter.',
  },
  {
    title: 'Idempotency keys',
    text: 'An idempotency key makes a repeated request harmless: the receiver dedupes the key.',
  },
  { title: 'Sourdough', text: 'Flour, water and patience make a starter bubble.' },
];

/** The document and its batch: a manifest of it and OTHERS, as the batch workflow hands its runs. */
async function agentInput(local: LocalParts, settings: Partial<AgentSettings> = {}) {
  const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
  const manifest = new ManifestWriter(local.blobs);
  await manifest.add({
    documentId: input.documentId,
    textRef: input.textRef,
    title: input.title,
    source: 'test',
  });
  for (const [i, other] of OTHERS.entries())
    await manifest.add({
      documentId: `other-${i}-${randomUUID().slice(0, 8)}`,
      textRef: await local.blobs.put(Buffer.from(other.text)),
      title: other.title,
      source: 'test',
    });
  const { manifestRef } = await manifest.finish();
  assert.ok(manifestRef !== undefined);
  const agent: AgentSettings = {
    maxTurns: 8,
    maxTokens: 200_000,
    historyEvents: 2_000,
    corpusRef: manifestRef,
    ...settings,
  };
  return { ...input, agent };
}

async function receiver(): Promise<CrossReferenceServer> {
  const server = await startCrossReferenceServer();
  defer(() => server.close());
  return server;
}

describe('an agent step on the time-skipping server', () => {
  it('runs a loop of turns and tool calls to an answer, and the publication carries it', async () => {
    const xref = await receiver();
    const local = await tempParts(defer, { env: { AGENT_TOOL_URL: xref.url } });
    const input = await agentInput(local);
    const { result, runId } = await withPipeline(env, local, input, async (handle) => ({
      result: await handle.result(),
      runId: handle.firstExecutionRunId,
    }));
    const related = result.related;
    assert.ok(related !== undefined, 'the run has no related result');
    assert.equal(related.agent.outcome, 'answered');
    // search, read, read, file, answer: five turns, four tool calls.
    assert.equal(related.agent.turns, 5);
    assert.deepEqual(
      related.agent.toolCalls.map((c) => [c.n, c.tool, c.outcome]),
      [
        [1, 'search', 'ok'],
        [2, 'read', 'ok'],
        [3, 'read', 'ok'],
        [4, 'fileCrossReference', 'ok'],
      ],
    );
    assert.deepEqual(
      related.related?.map((r) => r.title),
      ['Checkpoints in practice', 'Idempotency keys'],
    );
    assert.equal(related.crossReference, 'xref-1');
    // What the result table and npm run report print of the loop.
    assert.deepEqual(agentLines(result), [
      `related: answered in 5 turn(s) (0 from the memo), 4 tool call(s) (1 search ok, 2 read ok, 3 read ok, ` +
        `4 fileCrossReference ok), ${formatTokens(related.usage)}, ${formatCost(related.estimatedCostUsd)}`,
    ]);
    // One effect at the receiver, under the call's key <runId>:<step>:call-<n>.
    assert.deepEqual(
      xref.effects.map((e) => e.key),
      [`${runId}:related:call-4`],
    );
    // A span per turn and per tool call, with the GenAI attributes and the call's key.
    const mine = spans
      .getFinishedSpans()
      .filter((span) => String(span.attributes['pipeline.idempotency_key']).startsWith(runId));
    const turns = mine.filter((span) => span.name === 'agent turn');
    assert.deepEqual(
      turns.map((span) => [span.attributes['gen_ai.operation.name'], span.attributes['pipeline.agent.turn']]),
      [1, 2, 3, 4, 5].map((turn) => ['chat', turn]),
    );
    assert.ok(turns.every((span) => span.attributes['gen_ai.request.model'] === 'extractive-wink-nlp'));
    const calls = mine.filter((span) => span.name === 'agent tool call');
    assert.deepEqual(
      calls.map((span) => [span.attributes['gen_ai.tool.name'], span.attributes['pipeline.idempotency_key']]),
      ['search', 'read', 'read', 'fileCrossReference'].map((tool, i) => [
        tool,
        `${runId}:related:call-${i + 1}`,
      ]),
    );
    assert.ok(calls.every((span) => span.attributes['gen_ai.operation.name'] === 'execute_tool'));
    const publication = await local.store.currentPublication(input.documentId);
    assert.ok(publication !== undefined);
    assert.deepEqual(JSON.stringify(publication).includes('xref-1'), true, JSON.stringify(publication));
  });

  it('runs no agent when the input does not turn agent steps on', async () => {
    const local = await tempParts(defer);
    const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
    const result = await withPipeline(env, local, input, (handle) => handle.result());
    assert.equal(result.related, undefined);
    assert.ok(result.publication !== undefined);
  });

  it('ends at its turn limit with a clear outcome: the run publishes without the answer', async () => {
    const xref = await receiver();
    const local = await tempParts(defer, { env: { AGENT_TOOL_URL: xref.url } });
    const input = await agentInput(local, { maxTurns: 2 });
    const result = await withPipeline(env, local, input, (handle) => handle.result());
    assert.equal(result.related?.agent.outcome, 'turn-limit');
    assert.equal(result.related.agent.turns, 2);
    assert.equal(result.related.related, undefined);
    assert.ok(result.publication !== undefined, 'the run did not publish');
    assert.equal(xref.effects.length, 0);
  });

  it('ends at its token limit with a clear outcome', async () => {
    const local = await tempParts(defer);
    const input = await agentInput(local, { maxTokens: 100 });
    const result = await withPipeline(env, local, input, (handle) => handle.result());
    assert.equal(result.related?.agent.outcome, 'token-limit');
    assert.equal(result.related.agent.turns, 1);
    assert.ok(result.publication !== undefined, 'the run did not publish');
  });

  it('continues as new past the history size it is given, and finishes with one effect', async () => {
    const xref = await receiver();
    const local = await tempParts(defer, { env: { AGENT_TOOL_URL: xref.url } });
    const input = await agentInput(local, { historyEvents: 20 });
    const { result, runId } = await withPipeline(env, local, input, async (handle) => ({
      result: await handle.result(),
      runId: handle.firstExecutionRunId,
    }));
    assert.equal(result.related?.agent.outcome, 'answered');
    assert.ok(
      result.related.agent.continuedAsNew >= 1,
      `continued as new ${result.related.agent.continuedAsNew} times`,
    );
    assert.equal(result.related.agent.turns, 5);
    assert.deepEqual(
      xref.effects.map((e) => e.key),
      [`${runId}:related:call-4`],
    );
    assert.equal(result.related.crossReference, 'xref-1');
  });

  it('ends at its dollar limit with a clear outcome, priced through MODEL_PRICES', async () => {
    // 200 prompt and 30 completion tokens a turn at $1,000 per million each: $0.23 a turn. A limit of $0.30 lets
    // turn 2 go (after turn 1, $0.23 is under it) and ends the loop after it ($0.46).
    const server = await modelServerFor(defer, (request) => plannedTurn(request));
    const xref = await receiver();
    const local = await tempParts(defer, {
      model: 'configured',
      env: {
        MODEL: 'openai-compatible:gpt-4o-mini',
        OPENAI_BASE_URL: server.baseUrl,
        MODEL_PRICES: '{"gpt-4o-mini": {"inputPerMillion": 1000, "outputPerMillion": 1000}}',
        MODEL_RPM: '10000',
        MODEL_TPM: '10000000',
        AGENT_TOOL_URL: xref.url,
      },
    });
    const input = await agentInput(local, { maxCostUsd: 0.3 });
    const result = await withPipeline(env, local, input, (handle) => handle.result());
    assert.equal(result.related?.agent.outcome, 'cost-limit');
    assert.equal(result.related.agent.turns, 2);
    assert.equal(result.related.related, undefined);
    assert.ok(
      Math.abs((result.related.estimatedCostUsd ?? 0) - 0.46) < 1e-9,
      `cost ${result.related.estimatedCostUsd}`,
    );
    assert.equal(
      server.requests.filter((r) => r.step === 'related').length,
      2,
      'a turn was paid past the dollar limit',
    );
    assert.ok(result.publication !== undefined, 'the run did not publish');
  });

  it("ends at the run's budget with a clear outcome, paying nothing past it", async () => {
    // Turn 1 reports many prompt tokens: the run's budget then has no room for turn 2's reservation. 6,000 tokens
    // leave room for turn 1's own (its worst case, ~3,100 tokens: the document, the tools, the answer's limit).
    const server = await modelServerFor(defer, (request) =>
      plannedTurn(
        request,
        request.step === 'related' ? { prompt_tokens: 100_000, completion_tokens: 30 } : undefined,
      ),
    );
    const local = await tempParts(defer, {
      model: 'configured',
      env: {
        MODEL: 'openai-compatible:gpt-4o-mini',
        OPENAI_BASE_URL: server.baseUrl,
        MODEL_RPM: '10000',
        MODEL_TPM: '10000000',
      },
    });
    const input = { ...(await agentInput(local)), budget: { id: `budget-${randomUUID()}`, tokens: 6_000 } };
    const { result, refusals } = await withPipeline(env, local, input, async (handle) => {
      const result = await handle.result();
      // The refusal as the loop's history records it (the worker logs the same message).
      const history = await env.client.workflow.getHandle(`${handle.workflowId}:related`).fetchHistory();
      const refusals = (history.events ?? []).flatMap((e) => {
        const message = e.activityTaskFailedEventAttributes?.failure?.message;
        return message ? [message] : [];
      });
      return { result, refusals };
    });
    assert.equal(result.related?.agent.outcome, 'budget');
    // It says what happens: the loop ends and the run goes on, not that the run waits for a raise.
    assert.equal(refusals.length, 1, refusals.join('\n'));
    assert.match(
      refusals[0] ?? '',
      /the agent loop ends with outcome budget and the run goes on without its answer/,
    );
    assert.doesNotMatch(refusals[0] ?? '', /the run waits/);
    assert.equal(result.related.agent.turns, 1);
    assert.equal(
      server.requests.filter((r) => r.step === 'related').length,
      1,
      'a turn was paid past the budget',
    );
    assert.ok(result.publication !== undefined, 'the run did not publish');
  });
});
