import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { WorkflowFailedError } from '@temporalio/client';
import { ApplicationFailure, defaultPayloadConverter } from '@temporalio/common';
import { historyToJSON } from '@temporalio/common/lib/proto-utils';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime, Worker } from '@temporalio/worker';
import { Client } from '@temporalio/client';
import { createActivities } from '../activities';
import {
  AesGcmCodec,
  dataConverterFor,
  ENCRYPTED_ENCODING,
  generateKey,
  keyringFromSettings,
} from '../src/temporal/codec';
import { ConfigError } from '../src/config';
import { recoveryReport } from '../src/runs/history';
import { withDecodedResults } from '../src/runs/decode-history';
import { documentPipeline } from '../workflows';
import {
  completion,
  isTagRequest,
  localParts,
  openAIModel,
  pipelineInput,
  startModelServer,
  temporalExecutable,
} from './helpers';

const OLD_KEY = generateKey();
const NEW_KEY = generateKey();

function keyring(current: { id: string; key: string }, retired?: string) {
  const ring = keyringFromSettings({ key: current.key, keyId: current.id, retired });
  assert.ok(ring);
  return ring;
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
    env = await TestWorkflowEnvironment.createLocal({ server: { executable: temporalExecutable('cli') } });
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
      payloadEncryption: { key: NEW_KEY, keyId: 'test-key', retired: undefined, required: false },
    });
    const client = new Client({ connection: env.connection, dataConverter });
    const taskQueue = `codec-${randomUUID()}`;
    const worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue,
      workflowsPath: require.resolve('../workflows'),
      activities: createActivities(parts.deps),
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
});

/** Every base64 string in a JSON text, decoded, so a check sees inside payload `data` fields. */
function decodeAllBase64(json: string): string {
  return (json.match(/"[A-Za-z0-9+/=]{16,}"/g) ?? [])
    .map((quoted) => Buffer.from(quoted.slice(1, -1), 'base64').toString('latin1'))
    .join('\n');
}
