/**
 * `npm run bundle` (and `npm run build`, after tsc has compiled the project into dist/; `npm test`, before the
 * tests): bundles the workflows once into dist/workflow-bundle.js. Workers load that file instead of bundling at
 * every start (see src/temporal/bundle.ts); without it, or once a source is newer, they bundle from source.
 */
import fs from 'node:fs';
import path from 'node:path';
import { bundleWorkflowCode } from '@temporalio/worker';
import { runMain } from '../src/lib/run-main';
import { bundleStamp, WORKFLOW_BUNDLE_PATH } from '../src/temporal/bundle';

async function run(): Promise<void> {
  const started = Date.now();
  const { code } = await bundleWorkflowCode({
    workflowsPath: require.resolve('../workflows'),
    logger: { log() {}, trace() {}, debug() {}, info() {}, warn: console.warn, error: console.error },
  });
  fs.mkdirSync(path.dirname(WORKFLOW_BUNDLE_PATH), { recursive: true });
  // Written whole, then renamed into place: a worker starting meanwhile reads the old file or the new, never half.
  const partial = `${WORKFLOW_BUNDLE_PATH}.${process.pid}.tmp`;
  fs.writeFileSync(partial, `${bundleStamp()}${code}`);
  fs.renameSync(partial, WORKFLOW_BUNDLE_PATH);
  const kib = Math.round(code.length / 1024);
  console.log(
    `Workflow bundle: ${path.relative(process.cwd(), WORKFLOW_BUNDLE_PATH)}, ${kib} KiB, ${Date.now() - started} ms.`,
  );
}

runMain(run);
