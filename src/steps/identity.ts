/**
 * A step's identity: a hash of what shapes its answer, derived from its definition, so nothing is bumped by hand.
 * It goes into the memo key (a changed step is asked again; the old answers stay, and a revert finds them) and
 * into the step's result, where the result table and the report read it.
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { memoKeyFor, memoRequestHash } from '../model/memo';
import type { MemoRequest } from '../model/memo';
import type { DocumentModel, ModelRequest } from '../model/types';
import type { AnyModelStep } from './define';

/** The request a model step makes for `input`: its ask, with its name and where its offline answer lives. */
export function requestOf(step: AnyModelStep, input: object): ModelRequest<unknown> {
  const ask = step.ask(input);
  return { step: step.name, ...ask, offline: { ...definitionModule(step), input } };
}

/**
 * The step's identity for `request` on `model`: the model and the framing every request shares (the model's
 * promptVersion), the step's instructions, answer shape (its JSON schema, and the code that reads it) and token
 * limit; on the offline model, the source of the step's folder, since that code is the answer.
 */
export function stepIdentity(
  step: AnyModelStep,
  request: ModelRequest<unknown>,
  model: DocumentModel,
): string {
  const { answer } = request;
  const parts = {
    model: model.info,
    framing: model.promptVersion,
    instructions: request.instructions,
    answer:
      answer.kind === 'text'
        ? { kind: 'text', read: answer.read.toString() }
        : {
            kind: 'json',
            name: answer.name,
            schema: z.toJSONSchema(answer.schema),
            read: answer.read.toString(),
          },
    maxOutputTokens: request.maxOutputTokens,
    offline: model.info.provider === 'offline' ? folderSourceHash(step) : undefined,
  };
  return createHash('sha256').update(JSON.stringify(parts)).digest('hex').slice(0, 16);
}

/**
 * Which memo entry answers a model step's request: the workflow ID (stable across runs, so a resubmitted document
 * reuses what a failed run paid for), the step, and a hash of its identity and input. The one place the key is
 * built: a document's own step and bulk mode look up the same entry.
 */
export function memoRequestFor(
  step: AnyModelStep,
  input: object,
  model: DocumentModel,
  ids: { workflowId: string; runId: string },
): MemoRequest & { identity: string; request: ModelRequest<unknown> } {
  const request = requestOf(step, input);
  const identity = stepIdentity(step, request, model);
  const requestHash = memoRequestHash({ step: step.name, identity, input });
  return {
    memoKey: memoKeyFor(ids.workflowId, step.name, requestHash),
    workflowId: ids.workflowId,
    runId: ids.runId,
    step: step.name,
    requestHash,
    identity,
    request,
  };
}

/**
 * The module that exports a step's definition, and the name it is exported under: the offline model's thread
 * loads it there to run the step's offline answer (a function cannot cross to a thread), and its folder is the
 * step's offline code.
 */
export function definitionModule(step: AnyModelStep): { module: string; exportName: string } {
  const found = moduleOf.get(step) ?? findModule(step);
  moduleOf.set(step, found);
  return found;
}

const moduleOf = new WeakMap<AnyModelStep, { module: string; exportName: string }>();
const folderHashes = new Map<string, string>();

function findModule(step: AnyModelStep): { module: string; exportName: string } {
  for (const loaded of Object.values(require.cache)) {
    if (loaded === undefined) continue;
    const exports: unknown = loaded.exports;
    if (typeof exports !== 'object' || exports === null) continue;
    for (const [exportName, value] of Object.entries(exports)) {
      if (value === step) return { module: loaded.filename, exportName };
    }
  }
  throw new Error(
    `the definition of step "${step.name}" is not exported by any module: export it from its folder ` +
      `(export const ${step.name} = defineModelStep({...}) in activities/${step.name}/index.ts)`,
  );
}

/** A hash of the source files of the folder that defines `step` (its offline code among them). */
function folderSourceHash(step: AnyModelStep): string {
  const folder = path.dirname(definitionModule(step).module);
  const known = folderHashes.get(folder);
  if (known !== undefined) return known;
  const hash = createHash('sha256');
  for (const file of sourceFiles(folder))
    hash.update(`${path.relative(folder, file)}\0`).update(fs.readFileSync(file));
  const digest = hash.digest('hex');
  folderHashes.set(folder, digest);
  return digest;
}

/** The folder's source files (tests excepted), sorted, subfolders included. */
function sourceFiles(folder: string): string[] {
  return fs
    .readdirSync(folder, { withFileTypes: true, recursive: true })
    .filter(
      (entry) => entry.isFile() && /\.(ts|js|mjs|cjs|json)$/.test(entry.name) && !/\.test\./.test(entry.name),
    )
    .map((entry) => path.join(entry.parentPath, entry.name))
    .sort();
}
