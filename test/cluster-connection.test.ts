/**
 * A secured cluster, for real: a Temporal dev server behind a TLS-terminating gRPC proxy (test/grpc-tls-proxy.ts)
 * with a CA made for this test, mTLS and an API key. The project's worker process (`npm run worker`'s script) and
 * its client, configured for the cluster by TEMPORAL_* variables alone, run a document through it. Each wrong
 * set-up (a CA that did not sign the server's certificate, no client certificate, no API key, a wrong one) fails
 * at connect, in the worker and in the client, with a message that names what to set.
 */
import '../src/cli/compose';
import { before, describe, it } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { startWorkerProcess } from '../demo/worker-process';
import { loadConfig } from '../src/config';
import { processDocuments } from '../src/runs/batch';
import { openStores } from '../src/store/open';
import { ConnectionFailure, connectClient } from '../src/temporal/connection';
import { makeTestCertificates, startGrpcTlsProxy } from './grpc-tls-proxy';
import type { GrpcTlsProxy, TestCertificates } from './grpc-tls-proxy';
import { devServerEnv, installQuietRuntime, writeWorkflowBundle } from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

installQuietRuntime();
const defer = cleanupAfterAll();
const SAMPLE = path.resolve(__dirname, '..', 'samples', 'durable-execution.md');
const API_KEY = `test-key-${randomUUID()}`;

describe('a Temporal cluster behind TLS, mTLS and an API key', () => {
  let proxy: GrpcTlsProxy;
  let cluster: TestCertificates;
  let other: TestCertificates;
  let dataDir: string;
  let bundlePath: string;

  before(async () => {
    const env: TestWorkflowEnvironment = await devServerEnv();
    defer(() => env.teardown());
    dataDir = scratchDir(defer, 'cluster-connection-');
    cluster = makeTestCertificates(dataDir, 'cluster');
    other = makeTestCertificates(dataDir, 'other');
    proxy = await startGrpcTlsProxy({
      upstream: env.address,
      certificates: cluster,
      requireClientCert: true,
      apiKey: API_KEY,
    });
    defer(() => proxy.close());
    bundlePath = await writeWorkflowBundle(dataDir);
  });

  /**
   * What a deployment sets for this cluster: TEMPORAL_* only, plus the data folder the worker and the client share.
   * `over` changes a variable, or removes it when undefined.
   */
  function settings(over: Record<string, string | undefined> = {}): Record<string, string> {
    const all: Record<string, string | undefined> = {
      TEMPORAL_ADDRESS: proxy.address,
      TEMPORAL_TLS_SERVER_CA_CERT_PATH: cluster.caCert,
      TEMPORAL_TLS_SERVER_NAME: cluster.serverName,
      TEMPORAL_TLS_CLIENT_CERT_PATH: cluster.clientCert,
      TEMPORAL_TLS_CLIENT_KEY_PATH: cluster.clientKey,
      TEMPORAL_API_KEY: API_KEY,
      TEMPORAL_TASK_QUEUE: `cluster-${randomUUID()}`,
      DATA_DIR: dataDir,
      ...over,
    };
    const set: Record<string, string> = {};
    for (const [name, value] of Object.entries(all)) if (value !== undefined) set[name] = value;
    return set;
  }

  /** The worker process with `vars` and nothing of this process's environment but PATH and HOME. */
  function worker(vars: Record<string, string>): ReturnType<typeof startWorkerProcess> {
    const started = startWorkerProcess(
      // The prebuilt bundle only spares the worker the CPU of bundling; it has nothing to do with the cluster.
      {
        PATH: process.env.PATH ?? '',
        HOME: process.env.HOME ?? '',
        WORKFLOW_BUNDLE_PATH: bundlePath,
        ...vars,
      },
      { readyTimeoutMs: 120_000 },
    );
    void started.then(
      (w) => defer(async () => void (await w.kill())),
      () => undefined,
    );
    return started;
  }

  it(
    'runs a document: the worker process and the client go through TLS, mTLS and the API key',
    { timeout: 240_000 },
    async () => {
      const vars = settings();
      const forwardedBefore = proxy.forwarded();
      const running = await worker(vars);
      const config = loadConfig(vars);
      const { client, close } = await connectClient(config);
      const stores = await openStores(config);
      const lines: string[] = [];
      try {
        const report = await processDocuments(client, config, stores.blobs, [SAMPLE], {
          print: (line) => lines.push(line),
        });
        assert.equal(report.exitCode, 0, lines.join('\n'));
        assert.deepEqual(
          report.outcomes.map((o) => [o.error, o.result?.publication?.revision]),
          [[undefined, 1]],
          lines.join('\n'),
        );
      } finally {
        await stores.close();
        await close();
        // Stopped here, not with the file: its polls through the proxy would count as calls of the wrong set-ups
        // that follow, which must reach the server not once.
        await running.kill();
      }
      // Every call of the worker and the client went through the proxy, which checked the certificate and the key.
      assert.ok(
        proxy.forwarded() - forwardedBefore > 10,
        `only ${proxy.forwarded() - forwardedBefore} calls`,
      );
      assert.deepEqual(proxy.refusals, [], 'the proxy refused something of a right set-up');
    },
  );

  const wrongSetups: {
    what: string;
    over: () => Record<string, string | undefined>;
    /** What the worker and the client say: both must name the setting to fix. */
    says: RegExp;
    /** What the proxy saw: the handshake failed, or a stream was refused. */
    refused: RegExp;
  }[] = [
    {
      what: 'a worker and a client that trust another CA',
      over: () => ({ TEMPORAL_TLS_SERVER_CA_CERT_PATH: other.caCert }),
      says: /presented a TLS certificate this process does not trust \(.+\): set TEMPORAL_TLS_SERVER_CA_CERT_PATH/,
      refused: /^tls: /,
    },
    {
      what: 'no client certificate while the cluster requires mTLS',
      over: () => ({ TEMPORAL_TLS_CLIENT_CERT_PATH: undefined, TEMPORAL_TLS_CLIENT_KEY_PATH: undefined }),
      // rustls reads the server's alert, or a broken pipe when the server closes first: both name the fix.
      says: /client certificate.*TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH/,
      refused: /^tls: .*peer did not return a certificate/,
    },
    {
      what: 'no API key',
      over: () => ({ TEMPORAL_API_KEY: undefined }),
      says: /did not accept this connection \(no API key: authorization header missing\): check TEMPORAL_API_KEY/,
      refused: /^unauthenticated: no API key/,
    },
    {
      what: 'a wrong API key',
      over: () => ({ TEMPORAL_API_KEY: 'not-the-key' }),
      says: /did not accept this connection \(the API key is not valid\): check TEMPORAL_API_KEY/,
      refused: /^unauthenticated: the API key is not valid$/,
    },
  ];

  for (const setup of wrongSetups) {
    it(`refuses ${setup.what}, and both say what to set`, { timeout: 180_000 }, async (t: TestContext) => {
      const vars = settings(setup.over());
      const refusalsBefore = proxy.refusals.length;
      const forwardedBefore = proxy.forwarded();

      // `npm run worker` exits 1 with one line; the client (npm run pipeline, npm start) throws the same failure.
      const [workerSaid, clientSaid] = await Promise.all([
        worker(vars).then(
          (w) => assert.fail(`the worker started:\n${w.output()}`),
          (err: unknown) => String(err),
        ),
        connectClient(loadConfig(vars), { connectTimeout: '3 seconds' }).then(
          () => assert.fail('the client connected'),
          (err: unknown) => {
            assert.ok(err instanceof ConnectionFailure, String(err));
            return err.message;
          },
        ),
      ]);

      assert.match(workerSaid, /worker process ended \(exit 1\) before it was ready/, workerSaid);
      assert.match(workerSaid, setup.says, workerSaid);
      assert.match(clientSaid, setup.says);
      t.diagnostic(`worker: ${/"msg":"([^"]+)"/.exec(workerSaid)?.[1] ?? workerSaid}`);
      t.diagnostic(`client: ${clientSaid}`);
      const refusals = proxy.refusals.slice(refusalsBefore);
      assert.ok(
        refusals.some((r) => setup.refused.test(r)),
        `the proxy did not refuse it:\n${refusals.join('\n')}`,
      );
      assert.equal(proxy.forwarded(), forwardedBefore, 'a call of a wrong set-up reached the server');
    });
  }
});
