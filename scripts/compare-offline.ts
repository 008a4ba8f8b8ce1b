/**
 * `node --import tsx scripts/compare-offline.ts [git ref] [folders...]`: what a change to src/model/markdown.ts,
 * offline-nlp.ts or a step's offline answer (activities/<step>/offline.ts) does to the offline model's answers.
 * Loads those modules as they are at the ref
 * (default HEAD) beside the working copy's, runs both on every document (samples/ and the shared corpus unless
 * folders are given), prints each summary or tag list that differs, then the parse time of each version per
 * document, measured in the same run, alternating, after a warm-up.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { runMain } from '../src/lib/run-main';
import { SAMPLES_DIR } from '../src/config';
import { extractiveSummary } from '../activities/summarize/offline';
import { keywordTags } from '../activities/tag/offline';
import { markdownBlocks } from '../src/model/markdown';

const ROOT = path.resolve(__dirname, '..');
const SHARED_CORPUS = path.join(ROOT, '..', 'shared', 'corpus', 'rust-book');
/** Rounds of timing per document and version; the median is reported. */
const ROUNDS = 15;

interface Version {
  extractiveSummary(text: string, maxSentences: number): string;
  keywordTags(text: string, maxTags: number): string[];
}
type Blocks = (markdown: string) => unknown[];

/** This working copy's offline answers. */
const current: Version = { extractiveSummary, keywordTags };

/**
 * The ref's markdown.ts, offline-nlp.ts and the steps' offline answers, copied under .tmp/ in their layout (so they
 * resolve each other and this project's node_modules). Before the steps had folders, offline-nlp.ts held both.
 */
async function loadAt(ref: string): Promise<{ nlp: Version; blocks: Blocks }> {
  const dir = path.join(ROOT, '.tmp', `compare-offline-${process.pid}`);
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  const copy = (file: string): boolean => {
    let source: string;
    try {
      source = execFileSync('git', ['-C', ROOT, 'show', `${ref}:${file}`], {
        encoding: 'utf8',
        stdio: 'pipe',
      });
    } catch {
      return false;
    }
    fs.mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
    fs.writeFileSync(path.join(dir, file), source);
    return true;
  };
  copy('src/model/markdown.ts');
  copy('src/model/offline-nlp.ts');
  const load = async (file: string) => (await import(path.join(dir, file))) as Partial<Version>;
  const nlp: Partial<Version> = copy('activities/summarize/offline.ts')
    ? {
        ...(copy('activities/tag/offline.ts') ? await load('activities/tag/offline.ts') : {}),
        ...(await load('activities/summarize/offline.ts')),
      }
    : await load('src/model/offline-nlp.ts');
  if (nlp.extractiveSummary === undefined || nlp.keywordTags === undefined)
    throw new Error(`${ref} has no offline summary and tags this script knows how to load`);
  const markdown = (await import(path.join(dir, 'src/model/markdown.ts'))) as { markdownBlocks: Blocks };
  return { nlp: nlp as Version, blocks: markdown.markdownBlocks };
}

function documentsIn(folders: readonly string[]): Array<{ name: string; text: string }> {
  return folders.flatMap((folder) =>
    fs
      .readdirSync(folder)
      .filter((file) => /\.(?:md|markdown)$/.test(file))
      .sort()
      .map((file) => ({
        name: path.join(path.basename(folder), file),
        text: fs.readFileSync(path.join(folder, file), 'utf8'),
      })),
  );
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? 0;
}

async function run(): Promise<void> {
  const [ref = 'HEAD', ...given] = process.argv.slice(2);
  const folders = given.length > 0 ? given : [SAMPLES_DIR, SHARED_CORPUS].filter((f) => fs.existsSync(f));
  const before = await loadAt(ref);
  const documents = documentsIn(folders);

  let changed = 0;
  for (const { name, text } of documents) {
    const lines: string[] = [];
    const summaries = [before.nlp.extractiveSummary(text, 3), current.extractiveSummary(text, 3)];
    const tags = [before.nlp.keywordTags(text, 5).join(', '), current.keywordTags(text, 5).join(', ')];
    if (summaries[0] !== summaries[1])
      lines.push(`  summary before: ${summaries[0]}`, `  summary after:  ${summaries[1]}`);
    if (tags[0] !== tags[1]) lines.push(`  tags before: ${tags[0]}`, `  tags after:  ${tags[1]}`);
    if (lines.length > 0) {
      changed += 1;
      console.log(`${name}\n${lines.join('\n')}\n`);
    }
  }
  console.log(`${changed} of ${documents.length} documents answered differently (summary of 3, 5 tags).`);

  const times = { before: [] as number[], after: [] as number[] };
  let bytes = 0;
  for (const { text } of documents) {
    bytes += text.length;
    before.blocks(text);
    markdownBlocks(text);
    const rounds = { before: [] as number[], after: [] as number[] };
    for (let round = 0; round < ROUNDS; round++) {
      let started = performance.now();
      before.blocks(text);
      rounds.before.push(performance.now() - started);
      started = performance.now();
      markdownBlocks(text);
      rounds.after.push(performance.now() - started);
    }
    times.before.push(median(rounds.before));
    times.after.push(median(rounds.after));
  }
  const total = (values: number[]): number => values.reduce((sum, value) => sum + value, 0);
  const perDocument = (values: number[]): string =>
    `median ${(median(values) * 1000).toFixed(0)} µs, max ${(Math.max(...values) * 1000).toFixed(0)} µs, ` +
    `total ${total(values).toFixed(1)} ms`;
  console.log(
    `markdownBlocks over ${documents.length} documents (${(bytes / 1024).toFixed(0)} KiB), median of ${ROUNDS} ` +
      `rounds each:\n  ${ref}: ${perDocument(times.before)}\n  working copy: ${perDocument(times.after)}`,
  );
}

runMain(run);
