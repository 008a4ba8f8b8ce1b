import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { loadConfig } from '../src/config';
import { UserFacingError } from '../src/lib/run-main';
import { connectClient, connectionFailure, connectWorker } from '../src/temporal/connection';
import { freePort, tempDir } from './scratch';

/** The connection settings as every entry point reads them: through loadConfig. */
const temporalConnection = (env: NodeJS.ProcessEnv) => loadConfig(env).temporal;

describe('connecting to a secured cluster by configuration alone (envconfig)', () => {
  it('uses a local server when nothing names one', () => {
    assert.deepEqual(temporalConnection({}), { address: undefined, namespace: 'default', secure: {} });
  });

  it('turns TEMPORAL_API_KEY into an API key over TLS', () => {
    const conn = temporalConnection({
      TEMPORAL_ADDRESS: 'my-ns.a1b2c.tmprl.cloud:7233',
      TEMPORAL_NAMESPACE: 'my-ns.a1b2c',
      TEMPORAL_API_KEY: 'secret-api-key',
    });
    assert.equal(conn.address, 'my-ns.a1b2c.tmprl.cloud:7233');
    assert.equal(conn.namespace, 'my-ns.a1b2c');
    assert.equal(conn.secure.apiKey, 'secret-api-key');
    assert.equal(conn.secure.tls, true);
  });

  it('reads an mTLS client certificate and key from the TEMPORAL_TLS_* paths', () => {
    const dir = tempDir();
    try {
      fs.writeFileSync(path.join(dir, 'client.pem'), 'CERTIFICATE BYTES');
      fs.writeFileSync(path.join(dir, 'client.key'), 'KEY BYTES');
      const conn = temporalConnection({
        TEMPORAL_ADDRESS: 'temporal.internal:7233',
        TEMPORAL_TLS_CLIENT_CERT_PATH: path.join(dir, 'client.pem'),
        TEMPORAL_TLS_CLIENT_KEY_PATH: path.join(dir, 'client.key'),
        TEMPORAL_TLS_SERVER_NAME: 'temporal.internal',
      });
      const tls = conn.secure.tls;
      assert.ok(typeof tls === 'object' && tls !== null);
      assert.equal(tls.serverNameOverride, 'temporal.internal');
      assert.equal(Buffer.from(tls.clientCertPair?.crt ?? []).toString(), 'CERTIFICATE BYTES');
      assert.equal(Buffer.from(tls.clientCertPair?.key ?? []).toString(), 'KEY BYTES');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('loads a named profile from the TOML config file, with environment variables taking precedence', () => {
    const dir = tempDir();
    try {
      const file = path.join(dir, 'temporal.toml');
      fs.writeFileSync(
        file,
        [
          '[profile.staging]',
          'address = "staging.example.com:7233"',
          'namespace = "pipelines"',
          'api_key = "from-profile"',
        ].join('\n'),
      );
      const fromProfile = temporalConnection({ TEMPORAL_CONFIG_FILE: file, TEMPORAL_PROFILE: 'staging' });
      assert.equal(fromProfile.address, 'staging.example.com:7233');
      assert.equal(fromProfile.namespace, 'pipelines');
      assert.equal(fromProfile.secure.apiKey, 'from-profile');
      const overridden = temporalConnection({
        TEMPORAL_CONFIG_FILE: file,
        TEMPORAL_PROFILE: 'staging',
        TEMPORAL_NAMESPACE: 'other',
      });
      assert.equal(overridden.namespace, 'other');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('no server at the configured address', () => {
  const advice = '`npm run server` (the embedded server, until Ctrl-C), or set TEMPORAL_ADDRESS';

  it('a client (npm run pipeline, npm start with TEMPORAL_ADDRESS) says what to do, not the transport error', async () => {
    const address = `127.0.0.1:${await freePort()}`;
    const config = loadConfig({ TEMPORAL_ADDRESS: address });
    await assert.rejects(connectClient(config, { connectTimeout: '1 second' }), (err: unknown) => {
      assert.ok(err instanceof UserFacingError, String(err));
      assert.equal(
        err.message,
        `No Temporal server answers at ${address} (nothing answered in time): start one with ${advice}`,
      );
      return true;
    });
  });

  it('tells a server that refused (API key, TLS) apart from no server: starting one is no fix', () => {
    const endpoint = { address: 'my-ns.tmprl.cloud:7233', namespace: 'my-ns', secure: {} };
    const transport = (message: string): Error =>
      Object.assign(new Error(message), { name: 'TransportError' });
    const refused = connectionFailure(
      endpoint,
      transport('Failed to call GetSystemInfo: status: Unauthenticated, message: "Request unauthorized."'),
    );
    assert.ok(refused instanceof UserFacingError);
    assert.equal(
      refused.message,
      'The Temporal server at my-ns.tmprl.cloud:7233 did not accept this connection (Request unauthorized.): ' +
        'check TEMPORAL_API_KEY, the TEMPORAL_TLS_* settings and TEMPORAL_NAMESPACE',
    );
    const tls = connectionFailure(
      endpoint,
      transport('tonic::transport::Error(Transport, "invalid peer certificate")'),
    );
    assert.match(String(tls), /did not accept this connection \(certificate\)/);
    // Anything else that is no failure to connect is left as it is.
    const other = new Error('namespace my-ns is not found');
    assert.equal(connectionFailure(endpoint, other), other);
  });

  it('a worker says the same, with the transport reason', async () => {
    const address = `127.0.0.1:${await freePort()}`;
    await assert.rejects(connectWorker(loadConfig({ TEMPORAL_ADDRESS: address })), (err: unknown) => {
      assert.ok(err instanceof UserFacingError, String(err));
      assert.equal(
        err.message,
        `No Temporal server answers at ${address} (Connection refused): start one with ${advice}`,
      );
      return true;
    });
  });
});
