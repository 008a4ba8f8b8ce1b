/**
 * Standard Webhooks interop, judged by the reference library (`standardwebhooks`, its own `Webhook` class): what
 * the webhook publisher signs (POSTs and lookups) verifies with it, and `npm run publish-target`, run as a person
 * runs it, takes what it signs and refuses what it refuses: a tampered body, another secret, a timestamp too old or
 * too new, no signature. Those go over HTTP; last, the two verifiers are given the same malformed signatures and
 * edge-of-tolerance timestamps side by side and must agree.
 */
import { before, describe, it, mock } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import type { Publication } from '../src/publisher/types';
import { closeServer, listenOnLoopback, readBody } from '../src/lib/loopback';
import { SIGNATURE_TOLERANCE_SECONDS, verifier } from '../src/publisher/signature';
import { webhookPublisher } from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

const defer = cleanupAfterAll();
const ROOT = path.resolve(__dirname, '..');
const NO_ABORT = new AbortController().signal;

function newSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

/** A publication whose text is not ASCII: the signature covers the body's UTF-8 bytes, not its characters. */
function publication(documentId = `doc-${randomUUID()}`): Publication {
  return {
    documentId,
    title: 'Résumé: naïve café ✓',
    textRef: `sha256:${'a'.repeat(64)}`,
    summary: 'Checkpoints – «durable» 日本語 🚀.',
    tags: ['checkpoints'],
    model: { provider: 'offline', model: 'extractive-wink-nlp' },
  };
}

/** A request as it reached a server: what the reference verifier is given. */
interface Seen {
  method: string;
  url: string;
  headers: Record<string, string>;
  body: Buffer;
}

function flatHeaders(headers: http.IncomingHttpHeaders): Record<string, string> {
  const flat: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) if (typeof value === 'string') flat[name] = value;
  return flat;
}

/**
 * An HTTP server on loopback that records each request and answers it with `answer` (which may also destroy the
 * socket, as a reply lost after the effect), closed after the file's tests.
 */
async function tap(
  answer: (seen: Seen, res: http.ServerResponse) => Promise<void> | void,
): Promise<{ origin: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server = http.createServer((req, res) => {
    void readBody(req).then(async (body) => {
      const request = {
        method: req.method ?? '',
        url: req.url ?? '',
        headers: flatHeaders(req.headers),
        body,
      };
      seen.push(request);
      await answer(request, res);
    });
  });
  const origin = await listenOnLoopback(server, 'tap');
  defer(() => closeServer(server));
  return { origin, seen };
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** Sends one request with exactly these headers (Host included) and `body`, and reads the whole answer. */
function send(
  method: string,
  url: string,
  body: Buffer | string,
  headers: Record<string, string>,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, timeout: 30_000 });
    req.on('timeout', () => req.destroy(new Error(`${method} ${url}: no answer in 30 s`)));
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(chunks).toString('utf8'),
        }),
      );
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** The three Standard Webhooks headers as the reference library signs them, at `at`. */
function referenceHeaders(
  secret: string,
  id: string,
  body: string,
  at = new Date(),
): Record<'webhook-id' | 'webhook-timestamp' | 'webhook-signature', string> {
  return {
    'webhook-id': id,
    'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
    'webhook-signature': new Webhook(secret).sign(id, at, body),
  };
}

/**
 * `npm run publish-target` (the script it runs, under node with tsx) with PUBLISH_WEBHOOK_SECRET and a data
 * folder of its own on a port the system picks: its URL once it prints it. Killed after the file's tests.
 */
async function startPublishTarget(secret: string): Promise<string> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', path.join(ROOT, 'src/cli/publish-target.ts'), '0'],
    {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH ?? '',
        HOME: process.env.HOME ?? '',
        DATA_DIR: scratchDir(defer, 'publish-target-'),
        PUBLISH_WEBHOOK_SECRET: secret,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  defer(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  });
  let output = '';
  child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
  return new Promise((resolve, reject) => {
    // A busy machine loads tsx and the stores slowly; silence this long is a hang.
    const timer = setTimeout(() => reject(new Error(`publish target not up after 90 s:\n${output}`)), 90_000);
    child.stdout.on('data', (c: Buffer) => {
      output += c.toString('utf8');
      const url = /PUBLISH_WEBHOOK_URL=(\S+)/.exec(output)?.[1];
      if (url !== undefined) {
        clearTimeout(timer);
        resolve(url);
      }
    });
    void exited.then(() => {
      clearTimeout(timer);
      reject(new Error(`publish target exited before listening:\n${output}`));
    });
  });
}

describe('the webhook publisher, checked by the reference verifier', () => {
  it('signs each POST so that the reference Webhook verifies it, with the Idempotency-Key as webhook-id', async () => {
    const secret = newSecret();
    const receiver = await tap((_, res) => {
      res.writeHead(201, { 'content-type': 'application/json' }).end('{"revision":1}');
    });
    const doc = publication();

    const receipt = await webhookPublisher(defer, `${receiver.origin}/publications`, { secret }).publish(
      doc,
      'run-1:publish',
      NO_ABORT,
    );

    assert.equal(receipt.revision, 1);
    const [post] = receiver.seen;
    assert.ok(post !== undefined);
    assert.equal(post.headers['idempotency-key'], 'run-1:publish');
    assert.equal(post.headers['webhook-id'], 'run-1:publish');
    // The reference parses the payload it verified: it must be the publication, non-ASCII text intact.
    assert.deepEqual(new Webhook(secret).verify(post.body, post.headers), doc);
    assert.throws(() => new Webhook(newSecret()).verify(post.body, post.headers), {
      message: 'No matching signature found',
    });
  });

  it('signs its lookup GET as Standard Webhooks over an empty body, which the reference verifies', async () => {
    const secret = newSecret();
    // The POST's answer is lost after the effect; the lookup then says the receiver has it, naming the key and
    // the version (docs/deploy.md, the lookup by key).
    const doc = publication();
    const receiver = await tap((seen, res) => {
      if (seen.method === 'POST') res.socket?.destroy();
      else
        res
          .writeHead(200, { 'content-type': 'application/json' })
          .end(JSON.stringify({ idempotencyKey: 'run-1:publish', revision: 1, textRef: doc.textRef }));
    });
    const publisher = webhookPublisher(defer, `${receiver.origin}/publications`, {
      secret,
      lookupUrl: `${receiver.origin}/publications/{key}`,
      policy: 'hold',
      timeoutMs: 5_000,
    });

    await assert.rejects(publisher.publish(doc, 'run-1:publish', NO_ABORT));
    const receipt = await publisher.publish(doc, 'run-1:publish', NO_ABORT);

    assert.equal(receipt.duplicate, true);
    assert.deepEqual(
      receiver.seen.map((s) => `${s.method} ${s.url}`),
      ['POST /publications', 'GET /publications/run-1%3Apublish'],
    );
    const lookup = receiver.seen[1];
    assert.ok(lookup !== undefined);
    assert.equal(lookup.headers['webhook-id'], 'run-1:publish');
    assert.equal(lookup.body.length, 0);
    // An empty payload verifies to undefined; a wrong signature would throw.
    assert.equal(new Webhook(secret).verify(lookup.body, lookup.headers), undefined);
  });
});

describe('npm run publish-target, fed by the reference signer', () => {
  const secret = newSecret();
  let url = '';
  before(async () => {
    url = await startPublishTarget(secret);
  });

  const post = (body: string, headers: Record<string, string>): Promise<Answer> =>
    send('POST', url, body, { 'content-type': 'application/json', ...headers });

  it('takes what the webhook publisher signs, verified on the way by the reference', async () => {
    // The tap checks each request with the reference, then hands it on byte for byte.
    const verdicts: string[] = [];
    const relay = await tap(async (seen, res) => {
      try {
        new Webhook(secret).verify(seen.body, seen.headers);
        verdicts.push('verified');
      } catch (err) {
        verdicts.push(String(err));
      }
      const answer = await send(seen.method, url, seen.body, { ...seen.headers, host: new URL(url).host });
      const echo = answer.headers['idempotency-key'];
      res
        .writeHead(answer.status, {
          'content-type': 'application/json',
          ...(typeof echo === 'string' ? { 'idempotency-key': echo } : {}),
        })
        .end(answer.body);
    });
    const publisher = webhookPublisher(defer, `${relay.origin}/publications`, { secret });
    const doc = publication();
    const key = `${randomUUID()}:publish`;

    const first = await publisher.publish(doc, key, NO_ABORT);

    assert.deepEqual(verdicts, ['verified']);
    assert.deepEqual(
      { revision: first.revision, duplicate: first.duplicate, echoed: first.receiverHonoursKey },
      { revision: 1, duplicate: false, echoed: true },
    );
  });

  it('takes a request the reference signs, with its webhook-id as the key when no Idempotency-Key comes with it', async () => {
    const doc = publication();
    const body = JSON.stringify(doc);
    const id = `msg_${randomUUID()}`;

    // A plain Standard Webhooks sender sends the three headers only: webhook-id is its idempotency key.
    const first = await post(body, referenceHeaders(secret, id, body));
    const again = await post(body, { 'idempotency-key': id, ...referenceHeaders(secret, id, body) });

    assert.equal(first.status, 201, first.body);
    assert.equal(first.headers['idempotency-key'], id);
    assert.equal(again.status, 200, again.body);
    assert.equal((JSON.parse(again.body) as { duplicate?: boolean }).duplicate, true);
  });

  it('takes a signature list in which one entry matches, as a sender rotating secrets sends', async () => {
    const body = JSON.stringify(publication());
    const id = `msg_${randomUUID()}`;
    const genuine = referenceHeaders(secret, id, body);
    const retired = referenceHeaders(
      newSecret(),
      id,
      body,
      new Date(Number(genuine['webhook-timestamp']) * 1000),
    );
    const headers = {
      ...genuine,
      'webhook-signature': `${retired['webhook-signature']} ${genuine['webhook-signature']}`,
    };

    assert.deepEqual(new Webhook(secret).verify(body, headers), JSON.parse(body));
    const answer = await post(body, headers);
    assert.equal(answer.status, 201, answer.body);
  });

  it('refuses with 401 what the reference refuses: tampered, re-keyed, too old, too new, unsigned', async () => {
    const doc = publication();
    const body = JSON.stringify(doc);
    const id = `msg_${randomUUID()}`;
    const genuine = referenceHeaders(secret, id, body);
    const minutes = (n: number): Date => new Date(Date.now() + n * 60_000);
    const cases: {
      what: string;
      body: string;
      headers: Record<string, string>;
      reference: RegExp;
      ours: RegExp;
    }[] = [
      {
        what: 'a tampered body',
        body: JSON.stringify({ ...doc, summary: 'Forged.' }),
        headers: genuine,
        reference: /No matching signature found/,
        ours: /webhook-signature does not match the body/,
      },
      {
        what: 'signed with another secret',
        body,
        headers: referenceHeaders(newSecret(), id, body),
        reference: /No matching signature found/,
        ours: /webhook-signature does not match the body/,
      },
      {
        what: 'a timestamp six minutes old',
        body,
        headers: referenceHeaders(secret, id, body, minutes(-6)),
        reference: /Message timestamp too old/,
        ours: /s away from this receiver's clock/,
      },
      {
        what: 'a timestamp six minutes ahead',
        body,
        headers: referenceHeaders(secret, id, body, minutes(6)),
        reference: /Message timestamp too new/,
        ours: /s away from this receiver's clock/,
      },
      {
        what: 'no signature at all',
        body,
        headers: { 'idempotency-key': id },
        reference: /Missing required headers/,
        ours: /the request is not signed/,
      },
    ];

    for (const c of cases) {
      assert.throws(() => new Webhook(secret).verify(c.body, c.headers), { message: c.reference }, c.what);
      const answer = await post(c.body, c.headers);
      assert.equal(answer.status, 401, `${c.what}: ${answer.body}`);
      assert.match(answer.body, c.ours, c.what);
    }
    // None of them was written: the genuine request under the same id is the first.
    const genuineAnswer = await post(body, genuine);
    assert.equal(genuineAnswer.status, 201, genuineAnswer.body);
  });

  it('answers a lookup the reference signs over an empty body, and refuses one signed with another secret', async () => {
    const body = JSON.stringify(publication());
    const id = `msg_${randomUUID()}`;
    assert.equal((await post(body, referenceHeaders(secret, id, body))).status, 201);
    const lookupUrl = `${url}/${encodeURIComponent(id)}`;

    const found = await send('GET', lookupUrl, '', referenceHeaders(secret, id, ''));
    const forged = await send('GET', lookupUrl, '', referenceHeaders(newSecret(), id, ''));

    assert.equal(found.status, 200, found.body);
    assert.equal((JSON.parse(found.body) as { revision?: number }).revision, 1);
    assert.equal(forged.status, 401, forged.body);
  });
});

describe("the project's verifier and the reference agree on every verdict", () => {
  /** The reference's verdict on `headers` over `body` with its clock at `now`: 'ok' or its error message. */
  function referenceVerdict(
    secret: string,
    body: string,
    headers: Record<string, string>,
    now: number,
  ): string {
    // The reference reads its clock with Date.now() alone.
    const clock = mock.method(Date, 'now', () => now);
    try {
      new Webhook(secret).verify(body, headers, { jsonParse: false });
      return 'ok';
    } catch (err) {
      return err instanceof Error ? err.message : String(err);
    } finally {
      clock.mock.restore();
    }
  }

  function ourVerdict(secret: string, body: string, headers: Record<string, string>, now: number): string {
    const verdict = verifier(secret)(headers, Buffer.from(body), now);
    return verdict.ok ? 'ok' : verdict.reason;
  }

  it('refuses the forms of a right signature that the reference refuses: unpadded, base64url, with junk', () => {
    const secret = newSecret();
    const body = JSON.stringify(publication());
    const now = Date.now();
    const headers = referenceHeaders(secret, 'msg_1', body, new Date(now));
    const encoded = headers['webhook-signature'].slice('v1,'.length);
    const forms = {
      canonical: encoded,
      unpadded: encoded.replace(/=+$/, ''),
      base64url: Buffer.from(encoded, 'base64').toString('base64url'),
      'trailing junk': `${encoded}!!`,
      'a tab inside': `${encoded.slice(0, 8)}\t${encoded.slice(8)}`,
    };

    const verdicts = Object.entries(forms).map(([form, signature]) => {
      const given = { ...headers, 'webhook-signature': `v1,${signature}` };
      const [reference, ours] = [referenceVerdict, ourVerdict].map((judge) =>
        judge(secret, body, given, now),
      );
      return `${form}: ${reference === 'ok' ? 'ok' : 'refused'} / ${ours === 'ok' ? 'ok' : 'refused'}`;
    });

    assert.deepEqual(verdicts, [
      'canonical: ok / ok',
      'unpadded: refused / refused',
      'base64url: refused / refused',
      'trailing junk: refused / refused',
      'a tab inside: refused / refused',
    ]);
  });

  it('gives the same verdict at the edges of the five-minute tolerance, to the millisecond', () => {
    const secret = newSecret();
    const body = JSON.stringify(publication());
    const signedAt = Math.floor(Date.now() / 1000) * 1000;
    const headers = referenceHeaders(secret, 'msg_1', body, new Date(signedAt));
    const tolerance = SIGNATURE_TOLERANCE_SECONDS * 1000;
    // Received this long after (or, negative, before) the signing second began.
    const offsets = [
      tolerance,
      tolerance + 999,
      tolerance + 1000,
      -tolerance,
      -tolerance - 1,
      -tolerance - 1000,
    ];

    for (const offset of offsets) {
      const now = signedAt + offset;
      const reference = referenceVerdict(secret, body, headers, now) === 'ok';
      const ours = ourVerdict(secret, body, headers, now) === 'ok';
      assert.equal(ours, reference, `received ${offset} ms after signing: the reference says ${reference}`);
    }
  });
});
