/**
 * The prebuilt workflow bundle (`npm run build`): a worker takes it only while it is newer than every source it
 * could hold, so an edit to a workflow is never shadowed by yesterday's bundle.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { bundleStamp, prebuiltBundle } from '../src/temporal/bundle';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();

function at(file: string, seconds: number): void {
  fs.utimesSync(file, seconds, seconds);
}

describe('prebuiltBundle', () => {
  it('is none until npm run build made one', () => {
    const dir = scratchDir(defer, 'bundle-');
    assert.equal(prebuiltBundle(dir, path.join(dir, 'dist', 'workflow-bundle.js'), [dir]), undefined);
  });

  it('is the built file while it is newer than every source, and none once a source changed', () => {
    const dir = scratchDir(defer, 'bundle-');
    const sources = path.join(dir, 'workflows');
    fs.mkdirSync(path.join(sources, 'deep'), { recursive: true });
    const workflow = path.join(sources, 'deep', 'index.ts');
    fs.writeFileSync(workflow, 'export {};\n');
    const bundle = path.join(dir, 'workflow-bundle.js');
    fs.writeFileSync(bundle, `${bundleStamp()}// bundle\n`);
    at(workflow, 1_000);
    at(bundle, 2_000);

    assert.deepEqual(prebuiltBundle(sources, bundle, [sources]), { codePath: bundle });

    at(workflow, 3_000);
    assert.equal(prebuiltBundle(sources, bundle, [sources]), undefined);
  });

  it('is none when it was made for another version of the SDK (an upgrade since the build), or carries no stamp', () => {
    const dir = scratchDir(defer, 'bundle-');
    const bundle = path.join(dir, 'workflow-bundle.js');
    for (const content of [`${bundleStamp('1.0.0')}// bundle\n`, '// bundle\n', '']) {
      fs.writeFileSync(bundle, content);
      at(bundle, 2_000);
      assert.equal(
        prebuiltBundle(dir, bundle, [], bundleStamp('1.24.0')),
        undefined,
        JSON.stringify(content),
      );
    }
    fs.writeFileSync(bundle, `${bundleStamp('1.24.0')}// bundle\n`);
    assert.deepEqual(prebuiltBundle(dir, bundle, [], bundleStamp('1.24.0')), { codePath: bundle });
  });

  it('is what npm run bundle writes, stamped with the installed SDK', () => {
    assert.match(bundleStamp(), /^\/\* workflow bundle for @temporalio\/workflow \d+\.\d+\.\d+ \*\/$/);
  });
});
