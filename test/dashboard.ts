/** The Grafana dashboard docker-compose provisions, as the telemetry and compose tests read it. */
import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';

/** The Grafana dashboard docker-compose provisions. */
export const DASHBOARD_FILE = path.join(
  __dirname,
  '..',
  'deploy',
  'grafana',
  'dashboards',
  'document-pipeline.json',
);

/**
 * The metric names the dashboard's PromQL queries read, with a histogram's `_bucket`, `_sum` and `_count` taken off
 * (the name its page declares), and each panel's title with its queries.
 */
export function dashboardQueries(): {
  panels: { title: string; exprs: string[] }[];
  metricNames: Set<string>;
} {
  const Dashboard = z.object({
    panels: z.array(
      z.object({ title: z.string(), targets: z.array(z.object({ expr: z.string() })).min(1) }).loose(),
    ),
  });
  const dashboard = Dashboard.parse(JSON.parse(fs.readFileSync(DASHBOARD_FILE, 'utf8')));
  const panels = dashboard.panels.map((p) => ({ title: p.title, exprs: p.targets.map((t) => t.expr) }));
  const metricNames = new Set(
    panels
      .flatMap((p) => p.exprs)
      .flatMap((expr) => [...expr.matchAll(/\b((?:pipeline|temporal|process|nodejs)_[a-z0-9_]+)\b/g)])
      .map((m) => (m[1] ?? '').replace(/_(bucket|sum|count)$/, '')),
  );
  return { panels, metricNames };
}
