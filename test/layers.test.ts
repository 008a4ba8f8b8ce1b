/**
 * The two layers, one way: the kit (src/) never imports the face (workflows/, activities/), type-only imports
 * included; the entry points (src/cli/) and the composition root there are the only files that import both. And no
 * import circle anywhere in the project's own code.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import ts from 'typescript';

const ROOT = path.resolve(__dirname, '..');
const FACE = ['workflows', 'activities'];
const CODE = ['src', 'demo', ...FACE];

/** Every .ts file under the folders, relative to the root. */
function sources(folders: readonly string[]): string[] {
  return folders.flatMap((folder) =>
    fs
      .readdirSync(path.join(ROOT, folder), { withFileTypes: true, recursive: true })
      .filter((entry) => entry.isFile() && entry.name.endsWith('.ts'))
      .map((entry) => path.relative(ROOT, path.join(entry.parentPath, entry.name))),
  );
}

/** The project files a file imports: import, export-from, import type, require() and import(), resolved. */
function importsOf(file: string): string[] {
  const text = fs.readFileSync(path.join(ROOT, file), 'utf8');
  const { importedFiles } = ts.preProcessFile(text, true, true);
  return importedFiles.flatMap(({ fileName }) => {
    if (!fileName.startsWith('.')) return [];
    const base = path.resolve(path.dirname(path.join(ROOT, file)), fileName);
    const found = [`${base}.ts`, path.join(base, 'index.ts'), base].find(
      (candidate) => fs.existsSync(candidate) && fs.statSync(candidate).isFile(),
    );
    return found === undefined ? [] : [path.relative(ROOT, found)];
  });
}

const isFace = (file: string): boolean => FACE.some((folder) => file.startsWith(`${folder}/`));
const isEntryPoint = (file: string): boolean => file.startsWith('src/cli/');

/** The import circles among `files`: each a list of files, found by a depth-first walk (Tarjan's components). */
function circles(graph: Map<string, string[]>): string[][] {
  let index = 0;
  const order = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (file: string): void => {
    order.set(file, index);
    low.set(file, index++);
    stack.push(file);
    onStack.add(file);
    for (const next of graph.get(file) ?? []) {
      if (!order.has(next)) {
        visit(next);
        low.set(file, Math.min(low.get(file) ?? 0, low.get(next) ?? 0));
      } else if (onStack.has(next)) low.set(file, Math.min(low.get(file) ?? 0, order.get(next) ?? 0));
    }
    if (low.get(file) === order.get(file)) {
      const component: string[] = [];
      for (let member = stack.pop(); member !== undefined; member = stack.pop()) {
        onStack.delete(member);
        component.push(member);
        if (member === file) break;
      }
      if (component.length > 1 || (graph.get(file) ?? []).includes(file)) found.push(component.sort());
    }
  };
  for (const file of graph.keys()) if (!order.has(file)) visit(file);
  return found;
}

describe('layers', () => {
  const files = sources(CODE);
  const graph = new Map(files.map((file) => [file, importsOf(file)]));

  it('finds the imports it checks (the walk sees the composition root import the face)', () => {
    assert.ok(files.length > 100, `only ${files.length} files found`);
    assert.ok(
      graph.get('src/cli/compose.ts')?.includes('activities/index.ts'),
      'compose.ts imports the step list',
    );
  });

  it('the kit imports nothing from workflows/ or activities/, type-only imports included', () => {
    const crossings = files
      .filter((file) => file.startsWith('src/') && !isEntryPoint(file))
      .flatMap((file) => (graph.get(file) ?? []).filter(isFace).map((face) => `${file} -> ${face}`));
    assert.deepEqual(crossings, [], 'the step list is handed to the kit at src/cli/compose.ts instead');
  });

  it('the demo imports nothing from the face either', () => {
    const crossings = files
      .filter((file) => file.startsWith('demo/'))
      .flatMap((file) => (graph.get(file) ?? []).filter(isFace).map((face) => `${file} -> ${face}`));
    assert.deepEqual(crossings, []);
  });

  it('has no import circle, type-only imports included', () => {
    assert.deepEqual(circles(graph), []);
  });

  it('sees a circle when there is one', () => {
    const looped = new Map([
      ['a.ts', ['b.ts']],
      ['b.ts', ['c.ts']],
      ['c.ts', ['a.ts']],
      ['d.ts', ['a.ts']],
    ]);
    assert.deepEqual(circles(looped), [['a.ts', 'b.ts', 'c.ts']]);
  });
});
