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

/**
 * Two bar charts, one above the other: documents per second against the `ceiling` (a dashed line and a bar of its
 * own: the higher of the modelled and the measured one, see bench.ts), and per-step overhead where measured. The
 * yardstick's rows (Temporal alone) are grey, the pipeline's blue, so each pipeline bar reads against the floor and
 * the ceiling beside it.
 */
export function chart(rows: readonly Row[], ceiling?: number): string {
  const width = 960;
  const barHeight = 22;
  const labelWidth = 420;
  const height = 60 + (rows.length + 1) * (barHeight + 8) * 2 + 60;
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
    line?: { label: string; value: number },
  ): number => {
    parts.push(`<text x="10" y="${top}" font-weight="bold" font-size="15">${escape(title)}</text>`);
    const max = Math.max(...rows.map((r) => value(r) ?? 0), line?.value ?? 0, 1);
    const scale = (v: number): number => Math.max(1, ((width - labelWidth - 90) * v) / max);
    const bar = (label: string, v: number, fill: string, y: number): void => {
      parts.push(
        `<text x="10" y="${y + 15}">${escape(label)}</text>`,
        `<rect x="${labelWidth}" y="${y}" width="${scale(v)}" height="${barHeight}" fill="${fill}"/>`,
        `<text x="${labelWidth + scale(v) + 6}" y="${y + 15}">${v} ${unit}</text>`,
      );
    };
    let y = top + 14;
    const first = y;
    for (const r of rows) {
      const v = value(r);
      if (v === undefined) continue;
      bar(`${r.path} (${r.concurrency})`, v, r.path.startsWith('Temporal alone') ? '#9a9a9a' : '#3b6ea8', y);
      y += barHeight + 8;
    }
    if (line !== undefined) {
      bar(line.label, line.value, '#c77b30', y);
      const x = labelWidth + scale(line.value);
      parts.push(
        `<line x1="${x}" y1="${first - 4}" x2="${x}" y2="${y + barHeight}" stroke="#c77b30" stroke-dasharray="5,4"/>`,
      );
      y += barHeight + 8;
    }
    return y + 30;
  };
  const next = section(
    'Documents per second (higher is better)',
    30,
    (r) => r.docsPerSecond,
    'docs/s',
    ceiling === undefined
      ? undefined
      : { label: 'ceiling (Temporal alone + the model, nothing of ours)', value: ceiling },
  );
  section('Per-step overhead, p50 (lower is better)', next, (r) => r.perStepOverheadMsP50, 'ms');
  parts.push('</svg>');
  return parts.join('\n');
}
