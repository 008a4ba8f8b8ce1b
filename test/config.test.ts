/**
 * Configuration from the environment, and where the Temporal binaries come from. Both run before anything else
 * and are the first thing a person gets wrong, so every failure must name the variable to fix.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { resolveTemporalExecutable } from '../src/temporal/binaries';
import { ConfigError, loadConfig } from '../src/config';
import { DEFAULT_TASK_QUEUE } from '../src/contract';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();

/** An empty temp folder, removed after the file's tests. */
function scratch(): string {
  return scratchDir(defer, 'config-test-');
}

/** Writes a file with the given mode and returns its path. */
function file(dir: string, name: string, mode: number): string {
  const full = path.join(dir, name);
  fs.writeFileSync(full, '#!/bin/sh\nexit 0\n');
  fs.chmodSync(full, mode);
  return full;
}

/** Asserts that `load` throws a ConfigError whose message matches `message`. */
function assertConfigError(load: () => unknown, message: RegExp): void {
  assert.throws(load, (err) => {
    assert.ok(err instanceof ConfigError, `expected ConfigError, got ${String(err)}`);
    assert.match(err.message, message);
    return true;
  });
}

describe('loadConfig', () => {
  it('defaults to the offline model, the SQLite publisher and ./data', () => {
    const config = loadConfig({}, '/srv/pipeline');

    assert.deepEqual(config.model, { kind: 'offline' });
    assert.deepEqual(config.publisher, { kind: 'sqlite' });
    assert.equal(config.dataDir, path.resolve('/srv/pipeline', 'data'));
    assert.equal(config.temporal.address, undefined);
    assert.equal(config.temporal.namespace, 'default');
    assert.equal(config.taskQueue, DEFAULT_TASK_QUEUE);
    assert.equal(config.modelRequestTimeoutMs, 90_000);
    assert.equal(config.publishRequestTimeoutMs, 15_000);
    assert.equal(config.maxDocumentBytes, 1_000_000);
  });

  it('treats empty variables (as compose passes ${VAR:-}) as unset', () => {
    const config = loadConfig(
      {
        OPENAI_BASE_URL: '',
        OPENAI_MODEL: '',
        PUBLISH_WEBHOOK_URL: '',
        MAX_DOCUMENT_BYTES: '',
        DATA_DIR: '',
      },
      '/srv/pipeline',
    );

    assert.deepEqual(config.model, { kind: 'offline' });
    assert.deepEqual(config.publisher, { kind: 'sqlite' });
    assert.equal(config.maxDocumentBytes, 1_000_000);
    assert.equal(config.dataDir, path.resolve('/srv/pipeline', 'data'));
  });

  it('selects the OpenAI-compatible model when OPENAI_BASE_URL and OPENAI_MODEL are set', () => {
    const config = loadConfig({
      OPENAI_BASE_URL: 'http://localhost:11434/v1',
      OPENAI_MODEL: 'llama3.2',
      OPENAI_API_KEY: 'sk-test',
    });

    assert.deepEqual(config.model, {
      kind: 'remote',
      provider: 'openai-compatible',
      baseUrl: 'http://localhost:11434/v1',
      model: 'llama3.2',
      apiKey: 'sk-test',
      variables: { model: 'OPENAI_MODEL', baseUrl: 'OPENAI_BASE_URL', apiKey: 'OPENAI_API_KEY' },
    });
  });

  it('chooses the provider and model from MODEL, each provider at its own default address', () => {
    const chosen = (env: Record<string, string>) => {
      const { model } = loadConfig(env);
      return model.kind === 'remote'
        ? [model.provider, model.model, model.baseUrl, model.apiKey]
        : [model.kind];
    };
    assert.deepEqual(chosen({ MODEL: 'offline' }), ['offline']);
    assert.deepEqual(chosen({ MODEL: 'openai:gpt-4o-mini', OPENAI_API_KEY: 'sk-1' }), [
      'openai',
      'gpt-4o-mini',
      'https://api.openai.com/v1',
      'sk-1',
    ]);
    assert.deepEqual(chosen({ MODEL: 'anthropic:claude-haiku-4-5', ANTHROPIC_API_KEY: 'sk-ant-1' }), [
      'anthropic',
      'claude-haiku-4-5',
      'https://api.anthropic.com/v1',
      'sk-ant-1',
    ]);
    // Split at the first colon: Ollama's tags stay in the model name.
    assert.deepEqual(chosen({ MODEL: 'ollama:llama3.1:8b' }), [
      'ollama',
      'llama3.1:8b',
      'http://localhost:11434/v1',
      undefined,
    ]);
    assert.deepEqual(
      chosen({ MODEL: 'ollama:llama3.1', OPENAI_BASE_URL: 'http://host.docker.internal:11434/v1' }),
      ['ollama', 'llama3.1', 'http://host.docker.internal:11434/v1', undefined],
    );
    assert.deepEqual(
      chosen({
        MODEL: 'anthropic:claude-haiku-4-5',
        ANTHROPIC_API_KEY: 'k',
        ANTHROPIC_BASE_URL: 'http://gw/v1',
      }),
      ['anthropic', 'claude-haiku-4-5', 'http://gw/v1', 'k'],
    );
    assert.deepEqual(chosen({ MODEL: 'openai-compatible:qwen', OPENAI_BASE_URL: 'http://vllm:8000/v1' }), [
      'openai-compatible',
      'qwen',
      'http://vllm:8000/v1',
      undefined,
    ]);
  });

  it('refuses a MODEL it cannot use, saying what to set', () => {
    assertConfigError(
      () => loadConfig({ MODEL: 'gpt-4o-mini' }),
      /MODEL must be "offline" or "<provider>:<model>", one of openai:gpt-4o-mini, anthropic:claude-haiku-4-5/,
    );
    assertConfigError(() => loadConfig({ MODEL: 'mistral:large' }), /"mistral" is no provider/);
    assertConfigError(() => loadConfig({ MODEL: 'openai:' }), /MODEL must be/);
    assertConfigError(
      () => loadConfig({ MODEL: 'openai:gpt-4o-mini' }),
      /needs an API key: set OPENAI_API_KEY/,
    );
    assertConfigError(() => loadConfig({ MODEL: 'anthropic:claude-haiku-4-5' }), /set ANTHROPIC_API_KEY/);
    assertConfigError(() => loadConfig({ MODEL: 'openai-compatible:qwen' }), /needs OPENAI_BASE_URL: set it/);
    assertConfigError(
      () => loadConfig({ MODEL: 'ollama:llama3.1', OPENAI_MODEL: 'llama3.1' }),
      /MODEL and OPENAI_MODEL are both set/,
    );
    assertConfigError(
      () => loadConfig({ ANTHROPIC_BASE_URL: 'https://u:sk@gw.example.com/v1' }),
      /ANTHROPIC_BASE_URL: must not carry a user name or password .*put the API key in ANTHROPIC_API_KEY/,
    );
  });

  it('selects the webhook publisher when PUBLISH_WEBHOOK_URL is set, and resolves DATA_DIR against cwd', () => {
    const config = loadConfig(
      { PUBLISH_WEBHOOK_URL: 'https://example.com/hook', DATA_DIR: 'state' },
      '/srv/pipeline',
    );

    assert.deepEqual(config.publisher, { kind: 'webhook', url: 'https://example.com/hook' });
    assert.equal(config.dataDir, path.resolve('/srv/pipeline', 'state'));
  });

  it('reads numbers from strings', () => {
    const config = loadConfig({
      MODEL_REQUEST_TIMEOUT_MS: '5000',
      PUBLISH_REQUEST_TIMEOUT_MS: ' 250 ',
      MAX_DOCUMENT_BYTES: '2048',
      TEMPORAL_UI_PORT: '9000',
    });

    assert.equal(config.modelRequestTimeoutMs, 5000);
    assert.equal(config.publishRequestTimeoutMs, 250);
    assert.equal(config.maxDocumentBytes, 2048);
    assert.equal(config.uiPort, 9000);
  });

  it('names the variable holding a number that is not a positive whole number', () => {
    assertConfigError(
      () => loadConfig({ MODEL_REQUEST_TIMEOUT_MS: 'ten seconds' }),
      /MODEL_REQUEST_TIMEOUT_MS/,
    );
    assertConfigError(() => loadConfig({ MAX_DOCUMENT_BYTES: '-1' }), /MAX_DOCUMENT_BYTES/);
  });

  it('names OPENAI_BASE_URL when it is not an http(s) URL', () => {
    assertConfigError(
      () => loadConfig({ OPENAI_BASE_URL: 'localhost:11434', OPENAI_MODEL: 'm' }),
      /OPENAI_BASE_URL/,
    );
    assertConfigError(
      () => loadConfig({ OPENAI_BASE_URL: 'ftp://models.example.com', OPENAI_MODEL: 'm' }),
      /OPENAI_BASE_URL/,
    );
  });

  it('refuses a user name or password in a URL, saying where the credential belongs', () => {
    assertConfigError(
      () => loadConfig({ OPENAI_BASE_URL: 'https://me:sk-secret@api.example.com/v1', OPENAI_MODEL: 'm' }),
      /OPENAI_BASE_URL: must not carry a user name or password .*put the API key in OPENAI_API_KEY/,
    );
    assertConfigError(
      () => loadConfig({ PUBLISH_WEBHOOK_URL: 'https://hook:pw@receiver.example.com/in' }),
      /PUBLISH_WEBHOOK_URL: must not carry a user name or password .*PUBLISH_WEBHOOK_SECRET/,
    );
    assert.doesNotThrow(() => loadConfig({ PUBLISH_WEBHOOK_URL: 'https://receiver.example.com/in/T0K3N' }));
  });

  it('takes a Standard Webhooks secret for PUBLISH_WEBHOOK_SECRET and refuses anything weaker, saying how to make one', () => {
    const secret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
    assert.equal(loadConfig({ PUBLISH_WEBHOOK_SECRET: secret }).publishSecret, secret);
    for (const weak of ['hunter2', 'whsec_c2hvcnQ=', 'whsec_not base64 at all!!']) {
      assertConfigError(
        () => loadConfig({ PUBLISH_WEBHOOK_SECRET: weak }),
        /PUBLISH_WEBHOOK_SECRET: must be a Standard Webhooks secret.*openssl rand -base64 32/,
      );
    }
  });

  it('names PUBLISH_WEBHOOK_URL when it is not a URL', () => {
    assertConfigError(() => loadConfig({ PUBLISH_WEBHOOK_URL: 'not a url' }), /PUBLISH_WEBHOOK_URL/);
  });

  it('refuses OPENAI_MODEL (or OPENAI_API_KEY) without OPENAI_BASE_URL', () => {
    assertConfigError(() => loadConfig({ OPENAI_MODEL: 'gpt-4o-mini' }), /set OPENAI_BASE_URL/);
    assertConfigError(() => loadConfig({ OPENAI_API_KEY: 'sk-test' }), /set OPENAI_BASE_URL/);
  });

  it('keeps state in SQLite files unless DATABASE_URL names a PostgreSQL, and reads the fleet settings', () => {
    const defaults = loadConfig({ DATABASE_URL: '' });
    assert.deepEqual(defaults.database, { kind: 'sqlite' });
    assert.equal(defaults.memoLeaseMs, 30_000);
    assert.equal(defaults.maxProviderErrors, 6);
    assert.equal(defaults.stepBudgetMinutes, 60);
    assert.equal(defaults.openDeliveryPolicy, 'auto');

    const url = 'postgres://pipeline:secret@db.internal:5432/pipeline';
    const fleet = loadConfig({
      DATABASE_URL: url,
      MEMO_LEASE_SECONDS: '45',
      MAX_PROVIDER_ERRORS: '3',
      STEP_BUDGET_MINUTES: '240',
      OPEN_DELIVERY_POLICY: 'hold',
    });
    assert.deepEqual(fleet.database, { kind: 'postgres', url });
    assert.equal(fleet.memoLeaseMs, 45_000);
    assert.equal(fleet.maxProviderErrors, 3);
    assert.equal(fleet.stepBudgetMinutes, 240);
    assert.equal(fleet.openDeliveryPolicy, 'hold');
  });

  it("reads the provider's limits for the fleet (MODEL_RPM, MODEL_TPM, MODEL_MAX_CONCURRENT); unset or empty, none", () => {
    assert.deepEqual(loadConfig({}).modelLimits, {});
    // As docker-compose passes an unset one: `${MODEL_RPM:-}`.
    assert.deepEqual(loadConfig({ MODEL_RPM: '', MODEL_TPM: '', MODEL_MAX_CONCURRENT: '' }).modelLimits, {});
    assert.deepEqual(
      loadConfig({ MODEL_RPM: '500', MODEL_TPM: ' 200000 ', MODEL_MAX_CONCURRENT: '8' }).modelLimits,
      { requestsPerMinute: 500, tokensPerMinute: 200_000, maxConcurrent: 8 },
    );
    for (const name of ['MODEL_RPM', 'MODEL_TPM', 'MODEL_MAX_CONCURRENT']) {
      for (const value of ['0', '-5', '1.5', 'many']) {
        assertConfigError(() => loadConfig({ [name]: value }), new RegExp(name));
      }
    }
  });

  it('names DATABASE_URL when it is not a postgres:// URL, and OPEN_DELIVERY_POLICY when it is no policy', () => {
    assertConfigError(
      () => loadConfig({ DATABASE_URL: 'mysql://db/pipeline' }),
      /DATABASE_URL: must be a postgres/,
    );
    assertConfigError(() => loadConfig({ DATABASE_URL: 'data/state.db' }), /DATABASE_URL/);
    assertConfigError(() => loadConfig({ OPEN_DELIVERY_POLICY: 'maybe' }), /OPEN_DELIVERY_POLICY/);
  });

  it('refuses OPENAI_BASE_URL without OPENAI_MODEL', () => {
    assertConfigError(() => loadConfig({ OPENAI_BASE_URL: 'https://api.openai.com/v1' }), /OPENAI_MODEL=/);
  });
});

describe('resolveTemporalExecutable', () => {
  it('uses an explicit executable path', () => {
    const dir = scratch();
    const binary = file(dir, 'my-test-server', 0o755);

    assert.deepEqual(
      resolveTemporalExecutable('test-server', loadConfig({ TEMPORAL_TEST_SERVER_PATH: binary, PATH: '' })),
      {
        type: 'existing-path',
        path: binary,
      },
    );
  });

  it('refuses an explicit path that is not executable, naming the variable', () => {
    const dir = scratch();
    const notExecutable = file(dir, 'temporal', 0o644);

    assertConfigError(
      () => resolveTemporalExecutable('cli', loadConfig({ TEMPORAL_CLI_PATH: notExecutable, PATH: '' })),
      /TEMPORAL_CLI_PATH=/,
    );
    assertConfigError(
      () =>
        resolveTemporalExecutable(
          'test-server',
          loadConfig({ TEMPORAL_TEST_SERVER_PATH: path.join(dir, 'missing'), PATH: '' }),
        ),
      /TEMPORAL_TEST_SERVER_PATH=/,
    );
  });

  it('finds the command on PATH, skipping directories where it is not executable', () => {
    const [first, second] = [scratch(), scratch()];
    file(first, 'temporal', 0o644);
    const binary = file(second, 'temporal', 0o755);

    assert.deepEqual(
      resolveTemporalExecutable('cli', loadConfig({ PATH: [first, second].join(path.delimiter) }), {
        toolsDir: scratch(),
        downloadDir: scratch(),
      }),
      {
        type: 'existing-path',
        path: binary,
      },
    );
  });

  it("falls back to the SDK's cached download when nothing on PATH matches", () => {
    const empty = scratch();
    file(empty, 'temporal', 0o755); // the CLI, not the test server

    const places = { toolsDir: scratch(), downloadDir: scratch() };
    assert.deepEqual(resolveTemporalExecutable('test-server', loadConfig({ PATH: empty }), places), {
      type: 'cached-download',
    });
  });
});
