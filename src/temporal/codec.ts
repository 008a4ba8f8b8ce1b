import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import type { DataConverter, Payload, PayloadCodec } from '@temporalio/common';
import { METADATA_ENCODING_KEY } from '@temporalio/common';
import { temporal } from '@temporalio/proto';
import { ConfigError } from '../config';
import type { Config } from '../config';

export const ENCRYPTED_ENCODING = 'binary/encrypted';
export const KEY_ID_METADATA = 'encryption-key-id';
const IV_BYTES = 12;
const TAG_BYTES = 16;

export interface Keyring {
  /** The key new payloads are encrypted with. */
  current: { id: string; key: Buffer };
  /** Every key that may decrypt: the current one and retired ones, by ID. */
  keys: ReadonlyMap<string, Buffer>;
}

/**
 * AES-256-GCM payload codec. Every payload (workflow inputs and results, activity arguments and results, and,
 * with `encodeCommonAttributes`, failure messages) is sealed before it leaves the process, so the Temporal
 * server stores only ciphertext. The key ID travels in the payload's metadata: after a key rotation, payloads
 * written under a retired key still decode as long as that key stays in the keyring.
 */
export class AesGcmCodec implements PayloadCodec {
  constructor(private readonly keyring: Keyring) {}

  async encode(payloads: Payload[]): Promise<Payload[]> {
    const { id, key } = this.keyring.current;
    return payloads.map((payload) => {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv('aes-256-gcm', key, iv);
      cipher.setAAD(Buffer.from(id, 'utf8'));
      const plain = temporal.api.common.v1.Payload.encode(payload).finish();
      const sealed = Buffer.concat([iv, cipher.update(plain), cipher.final(), cipher.getAuthTag()]);
      return {
        metadata: {
          [METADATA_ENCODING_KEY]: Buffer.from(ENCRYPTED_ENCODING, 'utf8'),
          [KEY_ID_METADATA]: Buffer.from(id, 'utf8'),
        },
        data: sealed,
      };
    });
  }

  async decode(payloads: Payload[]): Promise<Payload[]> {
    return payloads.map((payload) => {
      const encoding = payload.metadata?.[METADATA_ENCODING_KEY];
      if (encoding === undefined || Buffer.from(encoding).toString('utf8') !== ENCRYPTED_ENCODING)
        return payload;
      const idBytes = payload.metadata?.[KEY_ID_METADATA];
      const id = idBytes ? Buffer.from(idBytes).toString('utf8') : '';
      const key = this.keyring.keys.get(id);
      if (key === undefined) {
        throw new Error(
          `payload was encrypted with key "${id}", which this process does not have: ` +
            'add it to PAYLOAD_DECRYPTION_KEYS as "<id>:<base64 key>"',
        );
      }
      const data = Buffer.from(payload.data ?? new Uint8Array());
      const decipher = createDecipheriv('aes-256-gcm', key, data.subarray(0, IV_BYTES));
      decipher.setAAD(Buffer.from(id, 'utf8'));
      decipher.setAuthTag(data.subarray(data.length - TAG_BYTES));
      const plain = Buffer.concat([
        decipher.update(data.subarray(IV_BYTES, data.length - TAG_BYTES)),
        decipher.final(),
      ]);
      return temporal.api.common.v1.Payload.decode(plain);
    });
  }
}

/** A fresh random 256-bit key, base64, for PAYLOAD_ENCRYPTION_KEY. */
export function generateKey(): string {
  return randomBytes(32).toString('base64');
}

/**
 * Builds the keyring from PAYLOAD_ENCRYPTION_KEY (base64, 32 bytes), PAYLOAD_ENCRYPTION_KEY_ID and the retired
 * keys in PAYLOAD_DECRYPTION_KEYS (`id:base64,id:base64`). Returns undefined when no key is set.
 */
export function keyringFromSettings(settings: {
  key: string | undefined;
  keyId: string;
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
  const current = { id: settings.keyId, key: decodeKey(settings.key, 'PAYLOAD_ENCRYPTION_KEY') };
  const keys = new Map<string, Buffer>([[current.id, current.key]]);
  for (const entry of (settings.retired ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '')) {
    const colon = entry.indexOf(':');
    if (colon <= 0) {
      throw new ConfigError(
        `PAYLOAD_DECRYPTION_KEYS entry "${entry.slice(0, 20)}..." must read "<id>:<base64 key>"`,
      );
    }
    const id = entry.slice(0, colon);
    if (!keys.has(id))
      keys.set(id, decodeKey(entry.slice(colon + 1), `PAYLOAD_DECRYPTION_KEYS (key "${id}")`));
  }
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
 * moved into an encoded payload too. Undefined (plain JSON) when no key is configured. Clients and workers
 * must agree: give them the same PAYLOAD_* settings.
 */
export function dataConverterFor(config: Pick<Config, 'payloadEncryption'>): DataConverter | undefined {
  const keyring = keyringFromSettings(config.payloadEncryption);
  if (keyring === undefined) return undefined;
  return {
    payloadCodecs: [new AesGcmCodec(keyring)],
    failureConverterPath: require.resolve('./failure-converter'),
  };
}
