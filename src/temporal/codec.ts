import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';
import type { DataConverter, Payload, PayloadCodec } from '@temporalio/common';
import { ApplicationFailure, METADATA_ENCODING_KEY } from '@temporalio/common';
import { temporal } from '@temporalio/proto';
import { ConfigError } from '../config';
import type { Config } from '../config';
import { FailureType } from '../contract';

export const ENCRYPTED_ENCODING = 'binary/encrypted';
export const KEY_ID_METADATA = 'encryption-key-id';
/**
 * How a payload was sealed. Payloads sealed before this mark existed carry none: their associated data was the
 * key ID alone, and they still open.
 */
export const FORMAT_METADATA = 'encryption-format';
export const SEALED_FORMAT = 'aes256gcm-v2';
/** The ApplicationFailure type of every payload the codec refuses to open. */
/**
 * The ID every key got before IDs were derived from the key. An unmarked payload under it, when no configured key
 * has that ID, opens with whichever configured key authenticates it, so runs sealed before the upgrade go on.
 */
const LEGACY_DEFAULT_KEY_ID = 'key-1';
const IV_BYTES = 12;
const TAG_BYTES = 16;

export interface Keyring {
  /** The key new payloads are encrypted with. */
  current: { id: string; key: Buffer };
  /** Every key that may decrypt: the current one and retired ones, by ID. */
  keys: ReadonlyMap<string, Buffer>;
}

/** A sealed payload's parts: `data` is `iv (12 bytes) | ciphertext | tag (16 bytes)`. */
export interface SealedParts {
  iv: Uint8Array;
  ciphertext: Uint8Array;
  tag: Uint8Array;
}

/**
 * AES-256-GCM payload codec. Every payload (workflow inputs and results, activity arguments and results, and,
 * with `encodeCommonAttributes`, failure messages) is sealed before it leaves the process, so the Temporal
 * server stores only ciphertext. The key ID travels in the payload's metadata: after a key rotation, payloads
 * written under a retired key still decode as long as that key stays in the keyring. With `requireEncryption`,
 * a payload that is not sealed is refused instead of passed through.
 */
export class AesGcmCodec implements PayloadCodec {
  private readonly requireEncryption: boolean;

  constructor(
    private readonly keyring: Keyring,
    { requireEncryption = false }: { requireEncryption?: boolean } = {},
  ) {
    this.requireEncryption = requireEncryption;
  }

  async encode(payloads: Payload[]): Promise<Payload[]> {
    const { id, key } = this.keyring.current;
    return payloads.map((payload) => {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv('aes-256-gcm', key, iv, { authTagLength: TAG_BYTES });
      cipher.setAAD(associatedData(SEALED_FORMAT, id));
      const plain = temporal.api.common.v1.Payload.encode(payload).finish();
      return {
        metadata: {
          [METADATA_ENCODING_KEY]: Buffer.from(ENCRYPTED_ENCODING, 'utf8'),
          [FORMAT_METADATA]: Buffer.from(SEALED_FORMAT, 'utf8'),
          [KEY_ID_METADATA]: Buffer.from(id, 'utf8'),
        },
        data: Buffer.concat([iv, cipher.update(plain), cipher.final(), cipher.getAuthTag()]),
      };
    });
  }

  async decode(payloads: Payload[]): Promise<Payload[]> {
    return payloads.map((payload) => this.open(payload));
  }

  private open(payload: Payload): Payload {
    const metadata = payload.metadata ?? {};
    const encoding = metadataText(metadata[METADATA_ENCODING_KEY]);
    if (encoding !== ENCRYPTED_ENCODING) {
      if (!this.requireEncryption) return payload;
      throw refused(
        `a plaintext payload (encoding "${encoding ?? 'none'}") was refused because PAYLOAD_REQUIRE_ENCRYPTION=true: ` +
          'it came from a client or worker without PAYLOAD_ENCRYPTION_KEY; give every client and worker the same ' +
          'PAYLOAD_* settings',
      );
    }
    const format = metadataText(metadata[FORMAT_METADATA]);
    if (format !== undefined && format !== SEALED_FORMAT) {
      throw refused(
        `an encrypted payload has format "${format}", which this version cannot open (it opens ` +
          `"${SEALED_FORMAT}" and the unmarked format before it): upgrade this process`,
      );
    }
    const id = metadataText(metadata[KEY_ID_METADATA]);
    if (id === undefined || id === '') {
      throw refused(
        `an encrypted payload carries no key ID (metadata "${KEY_ID_METADATA}"): it was not sealed by this codec`,
      );
    }
    const data = Buffer.from(payload.data ?? new Uint8Array());
    if (data.length < IV_BYTES + TAG_BYTES) {
      throw refused(
        `the encrypted payload under key "${id}" is ${data.length} bytes, shorter than its ` +
          `${IV_BYTES}-byte IV and ${TAG_BYTES}-byte tag: it was cut short or not sealed by this codec`,
      );
    }
    const parts = {
      iv: data.subarray(0, IV_BYTES),
      ciphertext: data.subarray(IV_BYTES, data.length - TAG_BYTES),
      tag: data.subarray(data.length - TAG_BYTES),
    };
    const aad = associatedData(format, id);
    const key = this.keyring.keys.get(id);
    const candidates =
      key !== undefined
        ? [key]
        : format === undefined && id === LEGACY_DEFAULT_KEY_ID
          ? [...this.keyring.keys.values()]
          : [];
    for (const candidate of candidates) {
      const plain = tryOpen(candidate, parts, aad);
      if (plain !== undefined) return temporal.api.common.v1.Payload.decode(plain);
    }
    if (key !== undefined) {
      throw refused(
        `the encrypted payload under key "${id}" does not open with the key this process has under that ID: ` +
          `it was altered, or another key was given the ID "${id}" (a new key needs a new ID; leave ` +
          'PAYLOAD_ENCRYPTION_KEY_ID unset to derive it from the key, and keep the old key in ' +
          'PAYLOAD_DECRYPTION_KEYS under its old ID)',
      );
    }
    throw refused(
      `payload was encrypted with key "${id}", which this process does not have: ` +
        `add it to PAYLOAD_DECRYPTION_KEYS as "${id}:<base64 key>"`,
    );
  }
}

/**
 * AES-256-GCM decryption, the one place a tag is checked. The tag length is pinned: without `authTagLength`,
 * Node accepts tags as short as 4 bytes, which a forger can guess.
 */
export function openAesGcm(key: Buffer, { iv, ciphertext, tag }: SealedParts, aad: Uint8Array): Buffer {
  const decipher = createDecipheriv('aes-256-gcm', key, iv, { authTagLength: TAG_BYTES });
  decipher.setAAD(aad);
  decipher.setAuthTag(tag);
  return Buffer.concat([decipher.update(ciphertext), decipher.final()]);
}

/** The plaintext, or undefined when the tag does not authenticate under this key. */
function tryOpen(key: Buffer, parts: SealedParts, aad: Uint8Array): Buffer | undefined {
  try {
    return openAesGcm(key, parts, aad);
  } catch {
    return undefined;
  }
}

/**
 * What the tag authenticates besides the ciphertext: the format, the encoding and the key ID, so a payload opens
 * only as what it was sealed as. Unmarked payloads (sealed before the format mark) bound the key ID alone.
 */
function associatedData(format: string | undefined, keyId: string): Buffer {
  return Buffer.from(format === undefined ? keyId : `${format}|${ENCRYPTED_ENCODING}|${keyId}`, 'utf8');
}

function metadataText(bytes: Uint8Array | null | undefined): string | undefined {
  return bytes === undefined || bytes === null ? undefined : Buffer.from(bytes).toString('utf8');
}

function refused(message: string): ApplicationFailure {
  return ApplicationFailure.create({ type: FailureType.PayloadRefused, message, nonRetryable: true });
}

/** A fresh random 256-bit key, base64, for PAYLOAD_ENCRYPTION_KEY. */
export function generateKey(): string {
  return randomBytes(32).toString('base64');
}

/**
 * The ID a key gets when none is given: `k-` and 12 hex digits of a SHA-256 over the key. Two keys never share it
 * by accident, and it reveals nothing usable about the key.
 */
export function keyIdOf(key: Buffer): string {
  return `k-${createHash('sha256').update('payload-encryption-key-id\0').update(key).digest('hex').slice(0, 12)}`;
}

/**
 * Builds the keyring from PAYLOAD_ENCRYPTION_KEY (base64, 32 bytes), PAYLOAD_ENCRYPTION_KEY_ID (unset: derived
 * from the key) and the retired keys in PAYLOAD_DECRYPTION_KEYS (`id:base64` or a bare `base64` whose ID is
 * derived, comma-separated). Two different keys under one ID are refused. Returns undefined when no key is set.
 */
export function keyringFromSettings(settings: {
  key: string | undefined;
  keyId: string | undefined;
  retired: string | undefined;
}): Keyring | undefined {
  if (settings.key === undefined) {
    if (settings.retired !== undefined) {
      throw new ConfigError(
        'PAYLOAD_DECRYPTION_KEYS is set without PAYLOAD_ENCRYPTION_KEY: set the current key too',
      );
    }
    return undefined;
  }
  const key = decodeKey(settings.key, 'PAYLOAD_ENCRYPTION_KEY');
  const current = { id: settings.keyId ?? keyIdOf(key), key };
  const keys = new Map<string, Buffer>();
  const origins = new Map<string, string>();
  const add = (id: string, key: Buffer, origin: string) => {
    const known = keys.get(id);
    if (known !== undefined && !known.equals(key)) {
      throw new ConfigError(
        `key ID "${id}" names two different keys (${origins.get(id) ?? 'an earlier key'} and ${origin}): ` +
          'payloads sealed under one would not open with the other. Give each key its own ID (leave ' +
          'PAYLOAD_ENCRYPTION_KEY_ID unset to derive it from the key) and keep a retired key under the ID it ' +
          'sealed with',
      );
    }
    keys.set(id, key);
    origins.set(id, origin);
  };
  add(current.id, current.key, 'PAYLOAD_ENCRYPTION_KEY');
  const entries = (settings.retired ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
  entries.forEach((entry, index) => {
    const where = `PAYLOAD_DECRYPTION_KEYS entry ${index + 1}`;
    const colon = entry.indexOf(':');
    // The message names the entry by position: echoing it would print key material.
    if (colon === 0) throw new ConfigError(`${where} must read "<id>:<base64 key>" or "<base64 key>"`);
    const id = colon > 0 ? entry.slice(0, colon) : undefined;
    const retiredKey = decodeKey(
      colon > 0 ? entry.slice(colon + 1) : entry,
      `${where} (key "${id ?? 'derived'}")`,
    );
    add(id ?? keyIdOf(retiredKey), retiredKey, where);
  });
  return { current, keys };
}

function decodeKey(base64: string, where: string): Buffer {
  const key = Buffer.from(base64, 'base64');
  if (key.length !== 32) {
    throw new ConfigError(
      `${where} must be 32 bytes in base64 (got ${key.length} bytes); make one with: npm run keygen`,
    );
  }
  return key;
}

/**
 * The data converter for clients and workers: AES-GCM on every payload, and failure messages and stack traces
 * moved into an encoded payload too. With PAYLOAD_REQUIRE_ENCRYPTION both refuse plaintext payloads. Undefined
 * (plain JSON) when no key is configured. Clients and workers must agree: give them the same PAYLOAD_* settings.
 */
export function dataConverterFor(config: Pick<Config, 'payloadEncryption'>): DataConverter | undefined {
  const keyring = keyringFromSettings(config.payloadEncryption);
  if (keyring === undefined) {
    if (config.payloadEncryption.required) {
      throw new ConfigError(
        'PAYLOAD_REQUIRE_ENCRYPTION=true needs PAYLOAD_ENCRYPTION_KEY: set the key (npm run keygen makes one) ' +
          'or unset PAYLOAD_REQUIRE_ENCRYPTION',
      );
    }
    return undefined;
  }
  return {
    payloadCodecs: [new AesGcmCodec(keyring, { requireEncryption: config.payloadEncryption.required })],
    failureConverterPath: require.resolve('./failure-converter'),
  };
}
