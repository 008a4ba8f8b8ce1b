/**
 * The alert rules Prometheus loads (deploy/prometheus/alerts.yml, named in prometheus.yml and mounted beside it by
 * docker-compose.yml) as Prometheus's own tool reads them: `promtool check rules` lints them, `promtool test rules`
 * runs deploy/prometheus/alerts.test.yml (a draft near its deadline fires before the deadline; a quiet queue does
 * not; failing samples say the gauges are stale), and every metric a rule names is one a worker's page serves.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ensurePromtool, runPromtool } from '../scripts/tools/promtool';
import { loadConfig } from '../src/config';
import { REVIEW_GAUGE_NAMES } from '../src/runs/review-gauges';
import { PIPELINE_METRIC_NAMES } from '../src/telemetry/metrics';

const DEPLOY = path.join(__dirname, '..', 'deploy', 'prometheus');

/** promtool's exit code and output for `args`, killed after 30 s. */
const promtool = (tool: string, args: string[]) => runPromtool(tool, args, { cwd: DEPLOY });

describe('alert rules', () => {
  it(
    'pass promtool check rules and promtool test rules, loaded by prometheus.yml',
    { timeout: 120_000 },
    async () => {
      const tool = await ensurePromtool({ searchPath: loadConfig().searchPath });
      const checked = await promtool(tool, ['check', 'rules', 'alerts.yml']);
      assert.equal(checked.code, 0, checked.output);
      assert.match(checked.output, /SUCCESS: 2 rules found/);
      const tested = await promtool(tool, ['test', 'rules', 'alerts.test.yml']);
      assert.equal(tested.code, 0, tested.output);
      const config = await promtool(tool, ['check', 'config', 'prometheus.yml']);
      assert.equal(config.code, 0, config.output);
      assert.match(config.output, /alerts\.yml\s+SUCCESS: 2 rules found/);
      // docker-compose.yml mounts the rules where prometheus.yml names them (beside it).
      const compose = fs.readFileSync(path.join(DEPLOY, '..', '..', 'docker-compose.yml'), 'utf8');
      assert.match(compose, /- \.\/deploy\/prometheus\/alerts\.yml:\/etc\/prometheus\/alerts\.yml:ro/);
    },
  );

  it('names only metrics a worker serves', () => {
    const rules = fs.readFileSync(path.join(DEPLOY, 'alerts.yml'), 'utf8');
    const served = new Set<string>([
      ...PIPELINE_METRIC_NAMES,
      ...REVIEW_GAUGE_NAMES,
      'pipeline_review_samples_failed_total',
    ]);
    const named = new Set([...rules.matchAll(/\bpipeline_\w+/g)].map((m) => m[0]));
    assert.ok(named.size > 0);
    for (const name of named)
      assert.ok(served.has(name), `${name} is in an alert rule, not on a worker's page`);
  });
});
