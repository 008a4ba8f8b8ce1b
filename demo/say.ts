/** The demo's output width: lines are wrapped at spaces, continuation lines indented by `indent`. */
const WIDTH = 110;

/** Prints `text` wrapped to WIDTH columns; a timed line (`+1.2 s ...`) continues under its text, not its time. */
export function say(
  text: string,
  indent = text.startsWith('+') ? ' '.repeat(text.indexOf(' s ') + 3) : '  ',
): void {
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(/(?<= )/)) {
    if (line.length + word.trimEnd().length > WIDTH && line.trim() !== '') {
      lines.push(line.trimEnd());
      line = indent;
    }
    line += word;
  }
  lines.push(line.trimEnd());
  console.log(lines.join('\n'));
}
