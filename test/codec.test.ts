import assert from 'node:assert/strict';
import { createCipheriv, createDecipheriv, randomBytes, randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { WorkflowFailedError } from '@temporalio/client';
import { ApplicationFailure, defaultPayloadConverter } from '@temporalio/common';
import type { Payload, PayloadCodec } from '@temporalio/common';
import { historyToJSON } from '@temporalio/common/lib/proto-utils';
import { temporal } from '@temporalio/proto';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime, Worker } from '@temporalio/worker';
import { Client } from '@temporalio/client';
import { pipelineActivities } from '../src/cli/compose';
import {
  AesGcmCodec,
  dataConverterFor,
  ENCRYPTED_ENCODING,
  generateKey,
  keyIdOf,
  keyringFromSettings,
  openAesGcm,
} from '../src/temporal/codec';
import { ConfigError, loadConfig } from '../src/config';
import { FailureType } from '../src/contract';
import { recoveryReport } from '../src/runs/history';
import { withDecodedResults } from '../src/runs/decode-history';
import { documentPipeline } from '../workflows';
import {
  completion,
  devServerEnv,
  isTagRequest,
  localParts,
  openAIModel,
  pipelineInput,
  pipelineWorker,
  startModelServer,
} from './helpers';

const OLD_KEY = generateKey();
const NEW_KEY = generateKey();

function keyring(current: { id: string; key: string }, retired?: string) {
  const ring = keyringFromSettings({ key: current.key, keyId: current.id, retired });
  assert.ok(ring);
  return ring;
}

/** The codec a process configured by `env` (PAYLOAD_* variables) gets, as workers and clients build it. */
function codecFrom(env: Record<string, string>): PayloadCodec {
  const codec = dataConverterFor(loadConfig(env))?.payloadCodecs?.[0];
  assert.ok(codec, 'no codec for these settings');
  return codec;
}

/** A metadata field of a payload, as text. */
function meta(payload: Payload | undefined, name: string): string | undefined {
  const bytes = payload?.metadata?.[name];
  return bytes ? Buffer.from(bytes).toString('utf8') : undefined;
}

/** The payload without one metadata field. */
function without(payload: Payload | undefined, name: string): Payload {
  const metadata = { ...payload?.metadata };
  delete metadata[name];
  return { ...payload, metadata };
}

/**
 * A payload sealed as versions before the format mark sealed it, spelled out here independently of the codec:
 * `iv (12) | ciphertext | tag (16)`, associated data = the key ID (or `aad`), no `encryption-format` metadata.
 */
function sealedTheOldWay(payload: Payload, id: string, base64Key: string, aad = id): Payload {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', Buffer.from(base64Key, 'base64'), iv);
  cipher.setAAD(Buffer.from(aad, 'utf8'));
  const plain = temporal.api.common.v1.Payload.encode(payload).finish();
  return {
    metadata: { encoding: Buffer.from(ENCRYPTED_ENCODING), 'encryption-key-id': Buffer.from(id) },
    data: Buffer.concat([iv, cipher.update(plain), cipher.final(), cipher.getAuthTag()]),
  };
}

/** For `assert.rejects`: the codec's refusal (a non-retryable ApplicationFailure) with a message matching `message`. */
function refusal(message: RegExp): (err: unknown) => boolean {
  return (err) => {
    assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
    assert.equal(err.type, FailureType.PayloadRefused);
    assert.equal(err.nonRetryable, true);
    assert.match(err.message, message);
    return true;
  };
}

describe('AES-GCM payload codec', () => {
  const plain = defaultPayloadConverter.toPayload({ text: 'the secret recipe for sourdough' });

  it('seals payloads so the plaintext is not in the stored bytes, and opens them again', async () => {
    const codec = new AesGcmCodec(keyring({ id: 'k1', key: NEW_KEY }));
    const [sealed] = await codec.encode([plain]);
    assert.ok(sealed);
    assert.equal(Buffer.from(sealed.metadata?.encoding ?? []).toString(), ENCRYPTED_ENCODING);
    assert.ok(
      !Buffer.from(sealed.data ?? [])
        .toString('latin1')
        .includes('sourdough'),
    );
    const [opened] = await codec.decode([sealed]);
    assert.ok(opened);
    assert.deepEqual(defaultPayloadConverter.fromPayload(opened), {
      text: 'the secret recipe for sourdough',
    });
  });

  it('still decodes payloads written under a retired key after rotation', async () => {
    const before = new AesGcmCodec(keyring({ id: 'old', key: OLD_KEY }));
    const [sealed] = await before.encode([plain]);
    assert.ok(sealed);
    const rotated = new AesGcmCodec(keyring({ id: 'new', key: NEW_KEY }, `old:${OLD_KEY}`));
    const [opened] = await rotated.decode([sealed]);
    assert.ok(opened);
    assert.deepEqual(defaultPayloadConverter.fromPayload(opened), {
      text: 'the secret recipe for sourdough',
    });
    const [resealed] = await rotated.encode([plain]);
    assert.equal(Buffer.from(resealed?.metadata?.['encryption-key-id'] ?? []).toString(), 'new');
  });

  it('names the missing key ID when a payload was sealed with a key it does not have', async () => {
    const [sealed] = await new AesGcmCodec(keyring({ id: 'old', key: OLD_KEY })).encode([plain]);
    assert.ok(sealed);
    await assert.rejects(
      new AesGcmCodec(keyring({ id: 'new', key: NEW_KEY })).decode([sealed]),
      /key "old".*PAYLOAD_DECRYPTION_KEYS/,
    );
  });

  it('refuses tampered ciphertext', async () => {
    const codec = new AesGcmCodec(keyring({ id: 'k1', key: NEW_KEY }));
    const [sealed] = await codec.encode([plain]);
    assert.ok(sealed?.data);
    const data = Buffer.from(sealed.data);
    data[20] = (data[20] ?? 0) ^ 0xff;
    await assert.rejects(codec.decode([{ ...sealed, data }]));
  });

  it('rejects keys of the wrong size with a message saying how to make one', () => {
    assert.throws(
      () => keyringFromSettings({ key: Buffer.alloc(16).toString('base64'), keyId: 'k', retired: undefined }),
      (err: unknown) => err instanceof ConfigError && /32 bytes.*npm run keygen/.test(err.message),
    );
    assert.equal(keyringFromSettings({ key: undefined, keyId: 'k', retired: undefined }), undefined);
  });
});

describe('key IDs and rotation', () => {
  const plain = defaultPayloadConverter.toPayload({ text: 'the secret recipe for sourdough' });

  it('derives each key ID from the key, so a rotation with no ID set keeps old payloads readable', async () => {
    const [sealed] = await codecFrom({ PAYLOAD_ENCRYPTION_KEY: OLD_KEY }).encode([plain]);
    const oldId = meta(sealed, 'encryption-key-id');
    assert.equal(oldId, keyIdOf(Buffer.from(OLD_KEY, 'base64')));
    assert.match(oldId ?? '', /^k-[0-9a-f]{12}$/);
    assert.ok(sealed);

    // The old key moves to PAYLOAD_DECRYPTION_KEYS as it is: its ID is derived there too.
    const rotated = codecFrom({ PAYLOAD_ENCRYPTION_KEY: NEW_KEY, PAYLOAD_DECRYPTION_KEYS: OLD_KEY });
    const [opened] = await rotated.decode([sealed]);
    assert.ok(opened);
    assert.deepEqual(defaultPayloadConverter.fromPayload(opened), {
      text: 'the secret recipe for sourdough',
    });
    const [resealed] = await rotated.encode([plain]);
    assert.equal(meta(resealed, 'encryption-key-id'), keyIdOf(Buffer.from(NEW_KEY, 'base64')));
    assert.notEqual(meta(resealed, 'encryption-key-id'), oldId);
  });

  it('refuses at start a rotated key that reuses the ID of the key it replaced, or two keys under one ID', () => {
    const refusesId = (env: Record<string, string>, id: string) =>
      assert.throws(
        () => dataConverterFor(loadConfig(env)),
        (err: unknown) =>
          err instanceof ConfigError &&
          err.message.includes(`key ID "${id}" names two different keys`) &&
          /PAYLOAD_ENCRYPTION_KEY_ID unset/.test(err.message) &&
          !err.message.includes(OLD_KEY) &&
          !err.message.includes(NEW_KEY),
      );
    refusesId(
      {
        PAYLOAD_ENCRYPTION_KEY: NEW_KEY,
        PAYLOAD_ENCRYPTION_KEY_ID: 'key-1',
        PAYLOAD_DECRYPTION_KEYS: `key-1:${OLD_KEY}`,
      },
      'key-1',
    );
    refusesId(
      { PAYLOAD_ENCRYPTION_KEY: NEW_KEY, PAYLOAD_DECRYPTION_KEYS: `old:${OLD_KEY},old:${generateKey()}` },
      'old',
    );
    // The same key listed twice under one ID is harmless.
    assert.ok(
      dataConverterFor(
        loadConfig({
          PAYLOAD_ENCRYPTION_KEY: NEW_KEY,
          PAYLOAD_ENCRYPTION_KEY_ID: 'key-2',
          PAYLOAD_DECRYPTION_KEYS: `key-2:${NEW_KEY},old:${OLD_KEY},old:${OLD_KEY}`,
        }),
      ),
    );
  });

  it('opens payloads sealed before the format mark, including those under the old default ID "key-1"', async () => {
    const explicit = sealedTheOldWay(plain, 'prod', OLD_KEY);
    const [opened] = await codecFrom({
      PAYLOAD_ENCRYPTION_KEY: NEW_KEY,
      PAYLOAD_DECRYPTION_KEYS: `prod:${OLD_KEY}`,
    }).decode([explicit]);
    assert.deepEqual(defaultPayloadConverter.fromPayload(opened ?? {}), {
      text: 'the secret recipe for sourdough',
    });

    // Every key used to get the ID "key-1" by default; after the upgrade the same key has a derived ID.
    const legacy = sealedTheOldWay(plain, 'key-1', OLD_KEY);
    const upgraded: Record<string, string>[] = [
      { PAYLOAD_ENCRYPTION_KEY: OLD_KEY },
      { PAYLOAD_ENCRYPTION_KEY: NEW_KEY, PAYLOAD_DECRYPTION_KEYS: OLD_KEY },
    ];
    for (const env of upgraded) {
      const [reopened] = await codecFrom(env).decode([legacy]);
      assert.deepEqual(defaultPayloadConverter.fromPayload(reopened ?? {}), {
        text: 'the secret recipe for sourdough',
      });
    }
    await assert.rejects(
      codecFrom({ PAYLOAD_ENCRYPTION_KEY: NEW_KEY }).decode([legacy]),
      refusal(/key "key-1".*PAYLOAD_DECRYPTION_KEYS as "key-1:<base64 key>"/),
    );
  });
});

describe('refused payloads', () => {
  const plain = defaultPayloadConverter.toPayload({ text: 'the secret recipe for sourdough' });
  const codec = new AesGcmCodec(keyring({ id: 'k1', key: NEW_KEY }));

  it('binds the format, the encoding and the key ID into the associated data', async () => {
    const [sealed] = await codec.encode([plain]);
    assert.equal(meta(sealed, 'encryption-format'), 'aes256gcm-v2');
    const data = Buffer.from(sealed?.data ?? []);
    const decipher = createDecipheriv('aes-256-gcm', Buffer.from(NEW_KEY, 'base64'), data.subarray(0, 12), {
      authTagLength: 16,
    });
    decipher.setAAD(Buffer.from('aes256gcm-v2|binary/encrypted|k1', 'utf8'));
    decipher.setAuthTag(data.subarray(data.length - 16));
    const inner = Buffer.concat([decipher.update(data.subarray(12, data.length - 16)), decipher.final()]);
    assert.deepEqual(defaultPayloadConverter.fromPayload(temporal.api.common.v1.Payload.decode(inner)), {
      text: 'the secret recipe for sourdough',
    });

    // Stripping the mark (to open it as an older payload) or adding it to an older payload breaks the tag.
    const unmarked = without(sealed, 'encryption-format');
    await assert.rejects(codec.decode([unmarked]), refusal(/does not open/));
    const old = sealedTheOldWay(plain, 'k1', NEW_KEY);
    const marked = {
      ...old,
      metadata: { ...old.metadata, 'encryption-format': Buffer.from('aes256gcm-v2') },
    };
    await assert.rejects(codec.decode([marked]), refusal(/does not open/));
  });

  it('pins the GCM tag to 16 bytes: a tag cut to 4 bytes does not authenticate', () => {
    const key = Buffer.from(NEW_KEY, 'base64');
    const iv = randomBytes(12);
    const aad = Buffer.from('aad');
    const cipher = createCipheriv('aes-256-gcm', key, iv);
    cipher.setAAD(aad);
    const ciphertext = Buffer.concat([cipher.update('forged?'), cipher.final()]);
    const tag = cipher.getAuthTag();
    assert.equal(openAesGcm(key, { iv, ciphertext, tag }, aad).toString(), 'forged?');
    assert.throws(
      () => openAesGcm(key, { iv, ciphertext, tag: tag.subarray(0, 4) }, aad),
      /authentication tag length/,
    );
  });

  it('refuses sealed payloads that are too short, lack a key ID, have an unknown format or were altered, naming the problem', async () => {
    const [sealed] = await codec.encode([plain]);
    assert.ok(sealed?.data);
    const data = Buffer.from(sealed.data);
    await assert.rejects(
      codec.decode([{ ...sealed, data: data.subarray(0, 27) }]),
      refusal(/under key "k1" is 27 bytes, shorter than its 12-byte IV and 16-byte tag/),
    );
    await assert.rejects(codec.decode([without(sealed, 'encryption-key-id')]), refusal(/carries no key ID/));
    await assert.rejects(
      codec.decode([
        { ...sealed, metadata: { ...sealed.metadata, 'encryption-format': Buffer.from('aes256gcm-v9') } },
      ]),
      refusal(/format "aes256gcm-v9".*upgrade this process/),
    );
    const altered = Buffer.from(data);
    altered[20] = (altered[20] ?? 0) ^ 0xff;
    await assert.rejects(
      codec.decode([{ ...sealed, data: altered }]),
      refusal(/under key "k1" does not open with the key this process has under that ID: it was altered/),
    );
  });

  it('refuses plaintext payloads when PAYLOAD_REQUIRE_ENCRYPTION=true, and passes them through otherwise', async () => {
    await assert.rejects(
      codecFrom({ PAYLOAD_ENCRYPTION_KEY: NEW_KEY, PAYLOAD_REQUIRE_ENCRYPTION: 'true' }).decode([plain]),
      refusal(
        /plaintext payload \(encoding "json\/plain"\) was refused because PAYLOAD_REQUIRE_ENCRYPTION=true/,
      ),
    );
    assert.deepEqual(await codecFrom({ PAYLOAD_ENCRYPTION_KEY: NEW_KEY }).decode([plain]), [plain]);
    assert.throws(
      () => dataConverterFor(loadConfig({ PAYLOAD_REQUIRE_ENCRYPTION: 'true' })),
      (err: unknown) =>
        err instanceof ConfigError &&
        /PAYLOAD_REQUIRE_ENCRYPTION=true needs PAYLOAD_ENCRYPTION_KEY/.test(err.message),
    );
  });
});

// Every SDK and activity log line of this test process, to check that no secret is ever logged.
const logs: string[] = [];
Runtime.install({
  logger: new DefaultLogger('DEBUG', (entry) =>
    logs.push(
      JSON.stringify(entry, (_key, value: unknown) => (typeof value === 'bigint' ? String(value) : value)),
    ),
  ),
});

describe('encrypted runs on a real dev server', () => {
  const SECRET_API_KEY = `sk-test-${randomUUID()}`;
  const TEXT_MARKER = 'Zanzibarian quokkas';
  const REJECTED_MARKER = 'Tasmanian wombats';
  let env: TestWorkflowEnvironment;

  before(async () => {
    env = await devServerEnv();
  });
  after(async () => {
    await env?.teardown();
  });

  it('stores no document text, summary, tag, failure message or API key in plaintext, logs no secret, and replays', async () => {
    const model = await startModelServer((request) => {
      if (JSON.stringify(request.body).includes(REJECTED_MARKER) && isTagRequest(request)) {
        return { status: 401, body: { error: 'invalid api key for wombat notes' } };
      }
      return isTagRequest(request)
        ? { body: completion(JSON.stringify({ tags: ['quokka fauna', 'island wildlife'] })) }
        : { body: completion(`${TEXT_MARKER} thrive on the island.`) };
    });
    const parts = await localParts({
      model: openAIModel(model, { apiKey: SECRET_API_KEY, requestTimeoutMs: 10_000 }),
    });
    const dataConverter = dataConverterFor({
      // Required: nothing this run legitimately writes (results, failures, retries) is refused.
      payloadEncryption: { key: NEW_KEY, keyId: 'test-key', retired: undefined, required: true },
    });
    const client = new Client({ connection: env.connection, dataConverter });
    const taskQueue = `codec-${randomUUID()}`;
    const worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue,
      workflowsPath: require.resolve('../workflows'),
      activities: pipelineActivities(parts.deps),
      dataConverter,
    });
    try {
      const good = await pipelineInput(
        parts.blobs,
        `# ${TEXT_MARKER}\n\n${TEXT_MARKER} live on one island only.`,
      );
      const bad = { ...(await pipelineInput(parts.blobs, 'x')), options: { maxTags: 999 } };
      const goodId = `codec-good-${randomUUID()}`;
      const badId = `codec-bad-${randomUUID()}`;
      const rejected = await pipelineInput(
        parts.blobs,
        `# ${REJECTED_MARKER}\n\n${REJECTED_MARKER} dig burrows.`,
      );
      const rejectedId = `codec-rejected-${randomUUID()}`;
      await worker.runUntil(async () => {
        const result = await client.workflow.execute(documentPipeline, {
          taskQueue,
          workflowId: goodId,
          args: [good],
        });
        assert.match(result.summary.summary, /quokkas/);
        await assert.rejects(
          client.workflow.execute(documentPipeline, { taskQueue, workflowId: badId, args: [bad] }),
          (err: unknown) =>
            err instanceof WorkflowFailedError &&
            err.cause instanceof ApplicationFailure &&
            /options\.maxTags/.test(err.cause.message),
        );
        await assert.rejects(
          client.workflow.execute(documentPipeline, { taskQueue, workflowId: rejectedId, args: [rejected] }),
          WorkflowFailedError,
        );
      });
      // The model server did get the key (it is the provider's credential), but only over HTTP.
      assert.equal(model.requests[0]?.authorization, `Bearer ${SECRET_API_KEY}`);
      assert.ok(logs.length > 0, 'the logger captured nothing: the check below would prove nothing');
      assert.ok(!logs.join('\n').includes(SECRET_API_KEY), 'a log line holds the API key');
      const described = await client.workflow.getHandle(goodId).describe();
      assert.ok(
        !JSON.stringify(described.raw.workflowExecutionInfo?.searchAttributes ?? {}).includes(SECRET_API_KEY),
      );

      // The activity failure's message is sealed too: the report opens it with the codec, and only with it.
      const rejectedHistory = await env.client.workflow.getHandle(rejectedId).fetchHistory();
      const sealedTag = recoveryReport(rejectedHistory).steps.find((step) => step.step === 'tag');
      assert.doesNotMatch(sealedTag?.lastFailure ?? '', /HTTP 401/);
      const opened = recoveryReport(await withDecodedResults(rejectedHistory, dataConverter));
      assert.match(
        opened.steps.find((step) => step.step === 'tag')?.lastFailure ?? '',
        /HTTP 401.*wombat notes/,
      );

      for (const workflowId of [goodId, badId, rejectedId]) {
        const raw = historyToJSON(await env.client.workflow.getHandle(workflowId).fetchHistory());
        const decodedText = Buffer.from(raw).toString('utf8');
        for (const needle of [
          TEXT_MARKER,
          'quokka fauna',
          'island wildlife',
          'options.maxTags',
          'wombat notes',
          SECRET_API_KEY,
        ]) {
          assert.ok(!decodedText.includes(needle), `history of ${workflowId} holds "${needle}" in plaintext`);
          // Payload bytes are base64 in the JSON form: look there too.
          assert.ok(
            !decodeAllBase64(raw).includes(needle),
            `history of ${workflowId} holds "${needle}" in a payload`,
          );
        }
      }

      const history = await env.client.workflow.getHandle(goodId).fetchHistory();
      await Worker.runReplayHistory(
        { workflowsPath: require.resolve('../workflows'), dataConverter },
        history,
        goodId,
      );
    } finally {
      await parts.close();
      await model.close();
    }
  });

  it('a worker that requires encryption refuses a run started by a client without the key, and runs no step', async () => {
    const parts = await localParts();
    const dataConverter = dataConverterFor({
      payloadEncryption: { key: NEW_KEY, keyId: undefined, retired: undefined, required: true },
    });
    const taskQueue = `codec-plain-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, parts.deps, { dataConverter });
    try {
      const input = await pipelineInput(parts.blobs, '# Injected\n\nStarted by a client without the key.');
      // env.client has no codec: its input reaches the server as plaintext JSON.
      const handle = await env.client.workflow.start(documentPipeline, {
        taskQueue,
        workflowId: `codec-plain-${randomUUID()}`,
        args: [input],
      });
      const history = await worker.runUntil(async () => {
        for (const deadline = Date.now() + 20_000; Date.now() < deadline;) {
          const seen = await handle.fetchHistory();
          if (seen.events?.some((e) => e.workflowTaskFailedEventAttributes)) return seen;
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
        assert.fail('the worker never failed the workflow task of the plaintext run');
      });
      await handle.terminate('test over');
      const events = history.events ?? [];
      assert.ok(!events.some((e) => e.activityTaskScheduledEventAttributes), 'a step was scheduled');
      // The worker's failure is sealed like any other payload: open it with the codec.
      const failure = events.find((e) => e.workflowTaskFailedEventAttributes)
        ?.workflowTaskFailedEventAttributes?.failure;
      assert.ok(failure?.encodedAttributes);
      const [attributes] =
        (await dataConverter?.payloadCodecs?.[0]?.decode([failure.encodedAttributes])) ?? [];
      assert.match(
        defaultPayloadConverter.fromPayload<{ message: string }>(attributes ?? {}).message,
        /plaintext payload .* was refused because PAYLOAD_REQUIRE_ENCRYPTION=true/,
      );
    } finally {
      await parts.close();
    }
  });
});

/** Every base64 string in a JSON text, decoded, so a check sees inside payload `data` fields. */
function decodeAllBase64(json: string): string {
  return (json.match(/"[A-Za-z0-9+/=]{16,}"/g) ?? [])
    .map((quoted) => Buffer.from(quoted.slice(1, -1), 'base64').toString('latin1'))
    .join('\n');
}
