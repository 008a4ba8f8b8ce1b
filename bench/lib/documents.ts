import fs from 'node:fs';
import path from 'node:path';

const ROOT = path.resolve(__dirname, '..', '..');
/** The shared corpus beside the repository, else the copy of part of it the tests keep. */
const CORPUS = [
  path.resolve(ROOT, '..', 'shared', 'corpus', 'rust-book'),
  path.join(ROOT, 'test', 'fixtures', 'corpus', 'rust-book'),
].find((dir) => fs.existsSync(dir));

/** `count` distinct documents of 1-4 KB cut from the corpus (or the samples), each with a line of its own. */
export function writeDocuments(dir: string, count: number): void {
  const source = CORPUS ?? path.join(ROOT, 'samples');
  const texts = fs
    .readdirSync(source)
    .filter((f) => f.endsWith('.md') && !/^README/i.test(f))
    .map((f) => fs.readFileSync(path.join(source, f), 'utf8'));
  fs.mkdirSync(dir, { recursive: true });
  for (let i = 0; i < count; i++) {
    const text = texts[i % texts.length] ?? '';
    const start = (i * 997) % Math.max(1, text.length - 4000);
    const body = text.slice(start, start + 1000 + ((i * 131) % 3000));
    fs.writeFileSync(path.join(dir, `doc-${String(i).padStart(5, '0')}.md`), `# Document ${i}\n\n${body}\n`);
  }
}
