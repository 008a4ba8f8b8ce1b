/**
 * The worker's metrics page as Prometheus's own linter reads it: a real `npm run worker` process on a dev server
 * runs a document, and `promtool check metrics` gets its page (the Temporal runtime's part, the pipeline's and the
 * Node process's). promtool comes from scripts/tools/promtool.ts, which npm test's runner calls first; that
 * installer is tested here too, from an empty folder with package lists of its own, as on a fresh CI machine.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { before, describe, it } from 'node:test';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { ensurePromtool, runPromtool } from '../scripts/tools/promtool';
import { loadConfig } from '../src/config';
import { REVIEW_GAUGE_NAMES } from '../src/runs/review-gauges';
import { PIPELINE_METRIC_NAMES } from '../src/telemetry/metrics';
import { connectClient } from '../src/temporal/connection';
import { devServerEnv, pipelineInput, SAMPLE_TEXT, startMetricsWorker, tempParts } from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

/** What `promtool check metrics` says about `page` (given on stdin, as its docs show), and its exit code. */
const promtoolCheck = (promtool: string, page: string) =>
  runPromtool(promtool, ['check', 'metrics'], { stdin: page });

describe('metrics lint', () => {
  it(
    "the worker's metrics page passes promtool check metrics, with every duration in seconds and so named",
    { timeout: 120_000 },
    async () => {
      const promtool = await ensurePromtool({ searchPath: loadConfig().searchPath });
      const local = await tempParts(defer);
      const taskQueue = `metrics-lint-${randomUUID()}`;
      const { metricsPort: port } = await startMetricsWorker(defer, env, local.dir, taskQueue);

      // One document, so the runtime's counters and histograms have samples, not only declarations.
      const { client, close } = await connectClient(
        loadConfig({ TEMPORAL_ADDRESS: env.address, TEMPORAL_NAMESPACE: env.namespace ?? 'default' }),
      );
      try {
        const input = await pipelineInput(local.blobs, SAMPLE_TEXT);
        await client.workflow.execute('documentPipeline', {
          taskQueue,
          workflowId: `wf-${randomUUID()}`,
          args: [input],
        });
      } finally {
        await close();
      }

      const res = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(30_000) });
      assert.equal(res.status, 200);
      const page = await res.text();
      // All three parts are there, so promtool lints each (not a comment where the runtime's part should be).
      assert.match(
        page,
        /^temporal_\w+\{[^}]*workflow_type="documentPipeline"[^}]*\} [1-9]/m,
        "no sample of the Temporal runtime's on the page",
      );
      // Durations in seconds are histograms (the review's wait), the rest counters.
      for (const name of PIPELINE_METRIC_NAMES)
        assert.match(
          page,
          new RegExp(`^# TYPE ${name} ${name.endsWith('_seconds') ? 'histogram' : 'counter'}$`, 'm'),
        );
      // The review queue's gauges (sampled from the server's index), and the count of samples that failed.
      for (const name of REVIEW_GAUGE_NAMES) assert.match(page, new RegExp(`^# TYPE ${name} gauge$`, 'm'));
      assert.match(page, /^# TYPE pipeline_review_samples_failed_total counter$/m);
      assert.match(page, /^# TYPE process_cpu_seconds_total counter$/m);

      const { code, output } = await promtoolCheck(promtool, page);
      assert.equal(output, '', `promtool check metrics found problems on the worker's page:\n${output}`);
      assert.equal(code, 0, `promtool check metrics exited with ${code}`);

      // promtool does not look at units: a histogram or summary measures something, and its name says in what.
      const measured = [...page.matchAll(/^# TYPE (\S+) (histogram|summary)$/gm)].map((m) => m[1] ?? '');
      assert.ok(
        measured.some((name) => name.startsWith('temporal_')),
        'no Temporal histogram on the page',
      );
      assert.deepEqual(
        measured.filter((name) => !/_(seconds|bytes)$/.test(name)),
        [],
        'histograms without a base unit (_seconds, _bytes) in the name',
      );
    },
  );
});

describe('promtool installer', () => {
  it(
    "unpacks only promtool from Debian's package into an empty tools folder, saying so in one line, then finds it there",
    { timeout: 180_000 },
    async () => {
      const toolsDir = path.join(scratchDir(defer, 'promtool-'), '.tools');
      const lines: string[] = [];
      const options = {
        toolsDir,
        searchPath: '',
        log: (line: string) => lines.push(line),
        privateLists: true,
      };
      const installed = await ensurePromtool(options);
      assert.equal(installed, path.join(toolsDir, 'bin', 'promtool'));
      assert.equal(lines.length, 1, lines.join('\n'));
      assert.match(
        lines[0] ?? '',
        /^Installing promtool into .*\.tools\/bin: only usr\/bin\/promtool, unpacked from Debian's prometheus package/,
      );
      const { code, output } = await promtoolCheck(installed, '# HELP up Up.\n# TYPE up gauge\nup 1\n');
      assert.deepEqual({ code, output }, { code: 0, output: '' });
      // Nothing but the tool is left behind: no .deb, no package lists, no prometheus server binary.
      assert.deepEqual(fs.readdirSync(toolsDir), ['bin']);
      assert.deepEqual(fs.readdirSync(path.join(toolsDir, 'bin')), ['promtool']);

      assert.equal(await ensurePromtool(options), installed);
      assert.equal(lines.length, 1, 'installed again although it was there');
    },
  );
});
