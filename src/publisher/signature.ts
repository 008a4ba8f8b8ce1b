/**
 * Signed webhook requests as Standard Webhooks has them (https://www.standardwebhooks.com): the sender adds
 * `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature: v1,<base64 HMAC-SHA256 of
 * "id.timestamp.body">` under a shared secret; the receiver recomputes it, compares in constant time and refuses a
 * timestamp outside the tolerance. Any Standard Webhooks library can verify what the webhook publisher sends.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';

/** How far a request's timestamp may be from the receiver's clock, either way: a replay older than this fails. */
export const SIGNATURE_TOLERANCE_SECONDS = 5 * 60;

/** What PUBLISH_WEBHOOK_SECRET must look like, and how to make one. */
export const SECRET_FORMAT =
  'must be a Standard Webhooks secret: "whsec_" followed by 24 to 64 random bytes in base64; ' +
  'make one with: echo "whsec_$(openssl rand -base64 32)"';

/** The HMAC key in a `whsec_<base64>` secret (the prefix is optional, as in Standard Webhooks), or undefined. */
function keyOf(secret: string): Buffer | undefined {
  const encoded = secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret;
  if (encoded.length % 4 !== 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(encoded)) return undefined;
  const key = Buffer.from(encoded, 'base64');
  return key.length >= 24 && key.length <= 64 ? key : undefined;
}

/** True when `secret` is a usable signing secret (see SECRET_FORMAT). */
export function isValidSecret(secret: string): boolean {
  return keyOf(secret) !== undefined;
}

function requireKey(secret: string): Buffer {
  const key = keyOf(secret);
  if (key === undefined) throw new Error(`PUBLISH_WEBHOOK_SECRET ${SECRET_FORMAT}`);
  return key;
}

function sign(key: Buffer, id: string, timestamp: string, body: Buffer | string): Buffer {
  return createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest();
}

/**
 * A signer for one secret: the three headers for a request with this id and body, signed now. The publisher uses
 * the idempotency key as the id, so the key is covered by the signature.
 */
export function signer(secret: string): (id: string, body: string, now?: number) => Record<string, string> {
  const key = requireKey(secret);
  return (id, body, now = Date.now()) => {
    const timestamp = String(Math.floor(now / 1000));
    return {
      'webhook-id': id,
      'webhook-timestamp': timestamp,
      'webhook-signature': `v1,${sign(key, id, timestamp, body).toString('base64')}`,
    };
  };
}

export type Verdict = { ok: true; id: string } | { ok: false; reason: string };

/**
 * What can be checked of a signed request before its body is read: the three headers are there and the timestamp
 * is within the tolerance. A receiver refuses an unsigned or replayed request this way, without buffering its body.
 */
export function checkSignatureHeaders(
  headers: IncomingHttpHeaders,
  now = Date.now(),
): { ok: true; id: string; timestamp: string; signatures: string } | { ok: false; reason: string } {
  const id = headerOf(headers, 'webhook-id');
  const timestamp = headerOf(headers, 'webhook-timestamp');
  const signatures = headerOf(headers, 'webhook-signature');
  if (id === undefined || timestamp === undefined || signatures === undefined) {
    const missing = Object.entries({ id, timestamp, signature: signatures })
      .filter(([, value]) => value === undefined)
      .map(([name]) => `webhook-${name}`);
    return {
      ok: false,
      reason:
        `the request is not signed: the ${missing.join(', ')} header${missing.length > 1 ? 's are' : ' is'} ` +
        'missing; the sender must sign with PUBLISH_WEBHOOK_SECRET (Standard Webhooks)',
    };
  }
  if (!/^\d{1,15}$/.test(timestamp)) {
    return { ok: false, reason: 'the webhook-timestamp header must be Unix time in whole seconds' };
  }
  // Whole seconds on both sides, as the reference library counts: a request at the edge gets the same verdict.
  const skew = Math.abs(Math.floor(now / 1000) - Number(timestamp));
  if (skew > SIGNATURE_TOLERANCE_SECONDS) {
    return {
      ok: false,
      reason:
        `the webhook-timestamp is ${Math.round(skew)} s away from this receiver's clock (at most ` +
        `${SIGNATURE_TOLERANCE_SECONDS} s allowed): a replayed request, or a clock to fix (NTP)`,
    };
  }
  return { ok: true, id, timestamp, signatures };
}

/**
 * A verifier for one secret: whether a request's headers sign exactly this body, within the tolerance. The
 * signature header may list several space-separated `v1,<sig>` entries (a sender rotating secrets); one must match.
 */
export function verifier(
  secret: string,
): (headers: IncomingHttpHeaders, body: Buffer, now?: number) => Verdict {
  const key = requireKey(secret);
  return (headers, body, now = Date.now()) => {
    const checked = checkSignatureHeaders(headers, now);
    if (!checked.ok) return checked;
    const { id, timestamp, signatures } = checked;
    // Compared as the exact base64 text, as the reference library does: decoding first would also take unpadded,
    // base64url or junk-laden forms of the signature, which other Standard Webhooks receivers refuse.
    const expected = Buffer.from(sign(key, id, timestamp, body).toString('base64'));
    const matches = signatures.split(' ').some((entry) => {
      const [version, encoded] = entry.split(',', 2);
      if (version !== 'v1' || encoded === undefined) return false;
      const given = Buffer.from(encoded);
      return given.length === expected.length && timingSafeEqual(given, expected);
    });
    if (!matches) {
      return {
        ok: false,
        reason:
          'the webhook-signature does not match the body: the sender signs with another PUBLISH_WEBHOOK_SECRET, ' +
          'or the request was altered',
      };
    }
    return { ok: true, id };
  };
}

function headerOf(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return typeof value === 'string' && value !== '' ? value : undefined;
}
