/**
 * With EMBEDDED_TEMPORAL_PORT set and no TEMPORAL_ADDRESS, `npm run review` and `npm run report` go to the server
 * `npm run server` started on that port, as its message says (and `npm run worker`, through the same endpoint);
 * before, they went to localhost:7233 whatever the port.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { loadConfig } from '../src/config';
import { REVIEW_STATUS } from '../src/contract/review';
import { configuredEndpoint } from '../src/temporal/connection';
import { devServerEnv, installQuietRuntime } from './helpers';
import { cleanupAfterAll } from './scratch';

const ROOT = path.join(__dirname, '..');
const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
});

/** `npm run <script> -- <args>` with only EMBEDDED_TEMPORAL_PORT naming the server. */
function cli(script: string, args: string[], port: string): Promise<{ stdout: string; stderr: string }> {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, EMBEDDED_TEMPORAL_PORT: port, LOG_LEVEL: 'error' };
  delete childEnv.TEMPORAL_ADDRESS;
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', path.join(ROOT, 'src', 'cli', `${script}.ts`), ...args],
      { cwd: ROOT, timeout: 90_000, env: childEnv },
      (_err, stdout, stderr) => resolve({ stdout, stderr }),
    );
  });
}

describe('EMBEDDED_TEMPORAL_PORT without TEMPORAL_ADDRESS', () => {
  it('names the endpoint the clients and workers connect to', () => {
    const config = loadConfig({ EMBEDDED_TEMPORAL_PORT: '17233' });
    assert.equal(configuredEndpoint(config).address, 'localhost:17233');
    assert.equal(configuredEndpoint(loadConfig({})).address, 'localhost:7233');
  });

  it(
    'npm run review and npm run report find the runs of the server on that port',
    { timeout: 180_000 },
    async () => {
      const port = env.address.slice(env.address.lastIndexOf(':') + 1);
      const workflowId = `document-port-${randomUUID()}`;
      // A run the queue lists (no worker on its task queue: its draft goes unanswered, by name).
      await env.client.workflow.start('documentPipeline', {
        taskQueue: `nobody-${randomUUID()}`,
        workflowId,
        args: [{}],
        typedSearchAttributes: [{ key: REVIEW_STATUS, value: 'awaiting' }],
      });
      const deadline = Date.now() + 60_000;
      let listed = await cli('review', [], port);
      while (!listed.stdout.includes(workflowId) && Date.now() < deadline)
        listed = await cli('review', [], port);
      assert.ok(listed.stdout.includes(workflowId), listed.stdout + listed.stderr);
      const report = await cli('report', [workflowId], port);
      assert.ok(`${report.stdout}${report.stderr}`.includes(workflowId), report.stdout + report.stderr);
      assert.doesNotMatch(report.stdout + report.stderr, /not found|no run/i);
    },
  );
});
