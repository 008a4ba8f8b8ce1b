/**
 * The OTEL_* variables as the OpenTelemetry specification reads them, through loadConfig: which endpoint, protocol,
 * headers, timeout and resource, when tracing is off, and what a person is told to fix. No server needed.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, loadConfig } from '../src/config';

const tracing = (env: NodeJS.ProcessEnv) => loadConfig(env).tracing;
const refused = (env: NodeJS.ProcessEnv, message: RegExp) =>
  assert.throws(
    () => loadConfig(env),
    (err) => err instanceof ConfigError && message.test(err.message),
  );

describe('OTEL_* settings', () => {
  it('traces nothing unless an endpoint (or OTEL_TRACES_EXPORTER=otlp) asks for it', () => {
    assert.equal(tracing({}).target, undefined);
    assert.equal(tracing({ OTEL_TRACES_EXPORTER: 'otlp' }).target?.url, 'http://localhost:4318/v1/traces');
  });

  it('exports http/protobuf to <endpoint>/v1/traces by default, the traces endpoint as it is', () => {
    assert.deepEqual(tracing({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318/' }).target, {
      protocol: 'http/protobuf',
      url: 'http://collector:4318/v1/traces',
      headers: {},
      timeoutMs: 10_000,
    });
    const both = tracing({
      OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318/base',
      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'https://traces.example.test/custom/path',
    });
    assert.equal(both.target?.url, 'https://traces.example.test/custom/path');
    assert.equal(
      tracing({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318/base' }).target?.url,
      'http://collector:4318/base/v1/traces',
    );
  });

  it('takes the protocol, headers and timeout, the TRACES_ variable over the general one', () => {
    const target = tracing({
      OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318',
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
      OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/json',
      OTEL_EXPORTER_OTLP_HEADERS: 'x-api-key=general,x-team=docs%20team',
      OTEL_EXPORTER_OTLP_TRACES_HEADERS: ' x-api-key = traces ',
      OTEL_EXPORTER_OTLP_TIMEOUT: '2500',
      OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: '1500',
    }).target;
    assert.equal(target?.protocol, 'http/json');
    assert.deepEqual(target?.headers, { 'x-api-key': 'traces', 'x-team': 'docs team' });
    assert.equal(target?.timeoutMs, 1500);
  });

  it('describes the process with OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES', () => {
    assert.deepEqual(tracing({}).resource, { 'service.name': 'document-pipeline' });
    assert.deepEqual(
      tracing({ OTEL_RESOURCE_ATTRIBUTES: 'service.name=from-attributes,deployment.environment=prod%2Feu' })
        .resource,
      { 'service.name': 'from-attributes', 'deployment.environment': 'prod/eu' },
    );
    assert.equal(
      tracing({ OTEL_SERVICE_NAME: 'named', OTEL_RESOURCE_ATTRIBUTES: 'service.name=other' }).resource[
        'service.name'
      ],
      'named',
    );
  });

  it('turns tracing off with OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none, endpoint or not', () => {
    const endpoint = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' };
    assert.equal(tracing({ ...endpoint, OTEL_SDK_DISABLED: 'TRUE' }).target, undefined);
    assert.equal(tracing({ ...endpoint, OTEL_TRACES_EXPORTER: 'none' }).target, undefined);
    assert.notEqual(tracing({ ...endpoint, OTEL_SDK_DISABLED: 'false' }).target, undefined);
  });

  it('refuses what it cannot do, saying which variable to set and how', () => {
    const endpoint = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' };
    refused(
      { ...endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' },
      /OTEL_EXPORTER_OTLP_PROTOCOL=grpc.*set OTEL_EXPORTER_OTLP_PROTOCOL=http\/protobuf/,
    );
    refused(
      { ...endpoint, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'grpc' },
      /set OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http\/protobuf/,
    );
    refused({ ...endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: 'thrift' }, /not an OTLP protocol/);
    refused({ ...endpoint, OTEL_TRACES_EXPORTER: 'zipkin' }, /OTEL_TRACES_EXPORTER=zipkin/);
    refused({ ...endpoint, OTEL_EXPORTER_OTLP_TIMEOUT: 'soon' }, /OTEL_EXPORTER_OTLP_TIMEOUT=soon/);
    refused(
      { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'https://user:pw@traces.example.test/v1/traces' },
      /OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: must not carry a user name or password/,
    );
  });

  it('names a bad header by its place, never by its value (it may be a key)', () => {
    const secret = 'sk-not-to-be-shown';
    assert.throws(
      () =>
        loadConfig({
          OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318',
          OTEL_EXPORTER_OTLP_HEADERS: `x-ok=1,${secret}`,
        }),
      (err) =>
        err instanceof ConfigError &&
        /OTEL_EXPORTER_OTLP_HEADERS: entry 2 is not key=value/.test(err.message) &&
        !err.message.includes(secret),
    );
  });
});
