import { round } from './rows';
import type { Row } from './rows';

/** The results as a markdown table, each path's time set against the checkpoint loop's `checkpointMs`. */
export function table(rows: readonly Row[], checkpointMs: number): string {
  const lines = [
    '| path | concurrency | ms per document p50 / p95 | per-step overhead ms p50 / p95 | vs checkpoint loop | docs/s | history events, bytes per document |',
    '|---|---|---|---|---|---|---|',
  ];
  for (const r of rows) {
    const overhead =
      r.perStepOverheadMsP50 !== undefined ? `${r.perStepOverheadMsP50} / ${r.perStepOverheadMsP95}` : '-';
    const ratio = `${round(r.msPerDocP50 / checkpointMs)}x`;
    const history =
      r.historyEventsPerDoc !== undefined ? `${r.historyEventsPerDoc}, ${r.historyBytesPerDoc}` : '-';
    lines.push(
      `| ${r.path} | ${r.concurrency} | ${r.msPerDocP50} / ${r.msPerDocP95} | ${overhead} | ${ratio} | ${r.docsPerSecond} | ${history} |`,
    );
  }
  return lines.join('\n');
}

/** Two bar charts side by side: documents per second, and per-step overhead where measured. */
export function chart(rows: readonly Row[]): string {
  const width = 960;
  const barHeight = 22;
  const labelWidth = 420;
  const height = 60 + rows.length * (barHeight + 8) * 2 + 60;
  const escape = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;');
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="13">`,
    `<rect width="100%" height="100%" fill="white"/>`,
  ];
  const section = (
    title: string,
    top: number,
    value: (r: Row) => number | undefined,
    unit: string,
  ): number => {
    parts.push(`<text x="10" y="${top}" font-weight="bold" font-size="15">${escape(title)}</text>`);
    const max = Math.max(...rows.map((r) => value(r) ?? 0), 1);
    let y = top + 14;
    for (const r of rows) {
      const v = value(r);
      if (v === undefined) continue;
      const w = Math.max(1, ((width - labelWidth - 90) * v) / max);
      parts.push(
        `<text x="10" y="${y + 15}">${escape(`${r.path} (${r.concurrency})`)}</text>`,
        `<rect x="${labelWidth}" y="${y}" width="${w}" height="${barHeight}" fill="#3b6ea8"/>`,
        `<text x="${labelWidth + w + 6}" y="${y + 15}">${v} ${unit}</text>`,
      );
      y += barHeight + 8;
    }
    return y + 30;
  };
  const next = section('Documents per second (higher is better)', 30, (r) => r.docsPerSecond, 'docs/s');
  section('Per-step overhead, p50 (lower is better)', next, (r) => r.perStepOverheadMsP50, 'ms');
  parts.push('</svg>');
  return parts.join('\n');
}
