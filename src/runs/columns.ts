/** Text cut to fit the terminal: one rule for the progress lines and the result table, so a title is cut once. */

/** Columns of the terminal output goes to; 100 when it is not one (a pipe, a log file). */
export function terminalWidth(stream: { columns?: number } = process.stdout): number {
  return stream.columns !== undefined && stream.columns > 0 ? stream.columns : 100;
}

/** `text` cut to `width` characters, with an ellipsis when cut. */
export function cut(text: string, width: number): string {
  return text.length <= width ? text : `${text.slice(0, Math.max(0, width - 1))}…`;
}

/** How wide a title may be on a line with `rest` characters of other columns: between 16 and 44. */
export function titleWidth(rest: number, columns = terminalWidth()): number {
  return Math.max(16, Math.min(44, columns - rest));
}
