/**
 * The review page attacked over raw HTTP (Host and Origin set by hand, as a browser on a rebinding page or a script
 * would), against a dev server with drafts awaiting review: only the page's own host names are served, a 1 GiB
 * body is refused unread, the Origin check trusts no Host header, a proxy's public origin decides, a weak password
 * is refused, the reviewer is the one the page authenticated, a banner and a form token cannot be forged or moved
 * to another draft, the queue says when it is cut, an edit is held to its step's own rules, and a document's
 * escape sequences reach `npm run review`'s terminal inert.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { z } from 'zod';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import type { Worker } from '@temporalio/worker';
import { steps } from '../activities';
import { loadConfig } from '../src/config';
import { workflowIdFor } from '../src/contract';
import type { documentPipeline } from '../workflows';
import { defineModelStep, modelSteps } from '../src/steps/define';
import { checkEdit } from '../src/steps/review-edits';
import { MAX_FORM_BYTES, startReviewPage } from '../src/runs/review-page';
import type { ReviewPageOptions } from '../src/runs/review-page';
import { decide } from '../src/runs/review-queue';
import { reviewQuery } from '../src/workflow';
import type { LocalParts, StartedPipeline } from './helpers';
import {
  devServerEnv,
  installQuietRuntime,
  pipelineInput,
  pipelineWorker,
  SAMPLE_TEXT,
  tempParts,
} from './helpers';
import { rawRequest } from './raw-http';
import type { RawAnswer } from './raw-http';
import { cleanupAfterAll } from './scratch';

const run = promisify(execFile);
const ROOT = path.join(__dirname, '..');
const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;
let local: LocalParts;
const taskQueue = `review-page-http-${randomUUID()}`;
const TOKEN = 'a-review-page-password-of-40-characters!';

before(async () => {
  env = await devServerEnv();
  defer(() => env.teardown());
  local = await tempParts(defer);
  const worker: Worker = await pipelineWorker(env, taskQueue, local.deps);
  const running = worker.run();
  defer(async () => {
    worker.shutdown();
    await running;
  });
});

/** A run of `text` whose draft awaits review (its input's title replaced where given). */
async function awaitingRun({
  text = SAMPLE_TEXT,
  title,
}: { text?: string; title?: string } = {}): Promise<StartedPipeline> {
  const input = {
    ...(await pipelineInput(local.blobs, text)),
    ...(title === undefined ? {} : { title }),
    review: { timeoutMinutes: 60, onTimeout: 'reject' as const },
  };
  // Under the project's own workflow ID (document-<id>), as npm run review names runs.
  const handle = await env.client.workflow.start<typeof documentPipeline>('documentPipeline', {
    taskQueue,
    workflowId: workflowIdFor(input.documentId),
    args: [input],
  });
  const deadline = Date.now() + 30_000;
  while ((await handle.query(reviewQuery)) === undefined) {
    assert.ok(Date.now() < deadline, 'the draft never came to await review');
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return handle;
}

/** A review page for this file's store, closed with the file. */
async function reviewPage(options: ReviewPageOptions = {}) {
  const page = await startReviewPage(env.client, local.blobs, { reviewer: 'ana', ...options });
  defer(() => page.close());
  return { ...page, port: new URL(page.url).port };
}

/** GETs the page until it lists `workflowId` (the server's index lags by a moment); returns its HTML. */
async function listed(
  url: string,
  workflowId: string,
  headers: Record<string, string> = {},
): Promise<string> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const answer = await rawRequest('GET', url, { headers: { host: new URL(url).host, ...headers } });
    if (answer.status === 200 && answer.body.includes(`value="${workflowId}"`)) return answer.body;
    assert.ok(Date.now() < deadline, `the page never listed ${workflowId}: ${answer.status}`);
    await new Promise((resolve) => setTimeout(resolve, 300));
  }
}

/** The form token the page gave the forms of `workflowId`'s draft. */
function csrfOf(html: string, workflowId: string): string {
  const match = new RegExp(
    `name="csrf" value="([^"]+)"><input type="hidden" name="workflowId" value="${workflowId}"`,
  ).exec(html);
  assert.ok(match?.[1] !== undefined, `no form for ${workflowId} on the page`);
  return match[1];
}

/** A decision posted as a form, with exactly these headers. */
function post(url: string, form: Record<string, string | string[]>, headers: Record<string, string>) {
  const body = new URLSearchParams();
  for (const [name, value] of Object.entries(form))
    for (const item of Array.isArray(value) ? value : [value]) body.append(name, item);
  return rawRequest('POST', `${url}decide`, {
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: body.toString(),
  });
}

describe('the review page over raw HTTP', () => {
  it('serves only its own host names and takes no Origin from the Host header (DNS rebinding)', async () => {
    const handle = await awaitingRun();
    const page = await reviewPage();
    const html = await listed(page.url, handle.workflowId);
    const csrf = csrfOf(html, handle.workflowId);
    const evilHost = `evil.example:${page.port}`;

    const rebound = await rawRequest('GET', page.url, { headers: { host: evilHost } });
    const reboundPost = await post(
      page.url,
      { csrf, workflowId: handle.workflowId, action: 'approve', reviewer: 'mallory' },
      { host: evilHost, origin: `http://${evilHost}` },
    );
    // The page's own Host, but an Origin naming the rebound host: the Origin is not read off the Host header.
    const foreignOrigin = await post(
      page.url,
      { csrf, workflowId: handle.workflowId, action: 'approve', reviewer: 'mallory' },
      { host: `127.0.0.1:${page.port}`, origin: `http://${evilHost}` },
    );
    const localhost = await rawRequest('GET', page.url, { headers: { host: `localhost:${page.port}` } });

    assert.deepEqual([rebound.status, reboundPost.status, foreignOrigin.status], [421, 421, 403]);
    assert.match(rebound.body, /does not answer to Host &#34;evil\.example:\d+&#34;/);
    for (const answer of [rebound, reboundPost, foreignOrigin]) {
      assert.doesNotMatch(answer.body, /Checkpoints|csrf/, 'a refusal carried the draft or its form');
    }
    assert.equal(localhost.status, 200);
    assert.equal((await handle.query(reviewQuery))?.decided, undefined, 'a forged post decided');
  });

  it('answers a 1 GiB body with 413 after at most its form limit, and grows far less than the body', async (t) => {
    const handle = await awaitingRun();
    const page = await reviewPage();
    const total = 1024 * 1024 * 1024;
    const before = process.memoryUsage();
    const headers = { host: `127.0.0.1:${page.port}` };

    const streamed = await upload(`${page.url}decide`, total, headers);
    const declared = await upload(
      `${page.url}decide`,
      total,
      { ...headers, 'content-length': String(total) },
      0,
    );
    const after = process.memoryUsage();

    assert.deepEqual([streamed.status, declared.status], [413, 413], streamed.body);
    assert.match(streamed.body, new RegExp(`at most ${MAX_FORM_BYTES} bytes`));
    assert.equal(declared.sent, 0);
    assert.ok(
      streamed.sent < 32 * 1024 * 1024,
      `the client sent ${streamed.sent} bytes before the page hung up`,
    );
    const grew = after.rss - before.rss;
    t.diagnostic(
      `1 GiB body: ${streamed.status} after ${streamed.sent} bytes sent; the process grew ${grew} bytes`,
    );
    assert.ok(grew < 64 * 1024 * 1024, `RSS grew ${grew} bytes for a 1 GiB body`);
    // And it still serves.
    await listed(page.url, handle.workflowId);
  });

  it(
    'decides behind a proxy at REVIEW_PAGE_ORIGIN, under the reviewer the password was given with',
    { timeout: 60_000 },
    async () => {
      const handle = await awaitingRun();
      const page = await reviewPage({ token: TOKEN, publicOrigin: 'https://review.example.com' });
      const auth = (user: string, password = TOKEN) =>
        `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;
      // As a TLS-terminating proxy forwards it: the public Host, the browser's https Origin.
      const proxied = { host: 'review.example.com', authorization: auth('ana') };
      const html = await listed(page.url, handle.workflowId, proxied);
      assert.match(html, /Deciding as <strong>ana<\/strong>/);
      assert.doesNotMatch(html, /name="reviewer"/, 'the page still asks for a name anyone can type');
      const wrongPassword = await rawRequest('GET', page.url, {
        headers: { ...proxied, authorization: auth('ana', 'guess') },
      });
      assert.equal(wrongPassword.status, 401);

      const decided = await post(
        page.url,
        {
          csrf: csrfOf(html, handle.workflowId),
          workflowId: handle.workflowId,
          updateId: randomUUID(),
          action: 'approve',
          reviewer: 'mallory',
        },
        { ...proxied, origin: 'https://review.example.com', 'sec-fetch-site': 'same-origin' },
      );
      assert.equal(decided.status, 303, decided.body);
      const result = await handle.result();
      assert.equal(result.review?.outcome, 'approved');
      assert.equal(result.review?.reviewer, 'ana');
    },
  );

  it('refuses a password a person could guess, in the config and at start', async () => {
    assert.throws(() => loadConfig({ REVIEW_PAGE_TOKEN: 'x' }), /REVIEW_PAGE_TOKEN.*at least 32 characters/);
    assert.equal(loadConfig({ REVIEW_PAGE_TOKEN: TOKEN }).reviewPageToken, TOKEN);
    await assert.rejects(reviewPage({ token: 'x', host: '0.0.0.0' }), /at least 32/);
    assert.throws(
      () => loadConfig({ REVIEW_PAGE_ORIGIN: 'https://review.example.com/queue' }),
      /REVIEW_PAGE_ORIGIN.*origin only/,
    );
  });

  it('shows only its own banners, ties a form token to its draft, and says when the queue is cut', async () => {
    const [first, second] = [await awaitingRun(), await awaitingRun()];
    const page = await reviewPage();
    const html = await listed(page.url, second.workflowId);
    await listed(page.url, first.workflowId);
    const host = { host: `127.0.0.1:${page.port}` };

    const forged = await rawRequest('GET', `${page.url}?said=${encodeURIComponent('Approved: all clear')}`, {
      headers: host,
    });
    assert.equal(forged.status, 200);
    assert.doesNotMatch(forged.body, /all clear/, 'a link put words in the page’s mouth');

    const moved = await post(
      page.url,
      { csrf: csrfOf(html, second.workflowId), workflowId: first.workflowId, action: 'approve' },
      host,
    );
    assert.equal(moved.status, 403, 'one draft’s form token decided another');
    assert.equal((await first.query(reviewQuery))?.decided, undefined);

    // Capped at one draft a page, the page says so, and shows the run started longest ago.
    const capped = await reviewPage({ limit: 1 });
    const cut = await rawRequest('GET', capped.url, { headers: { host: `127.0.0.1:${capped.port}` } });
    assert.match(cut.body, /Showing 1 of the \d+ runs awaiting review \(at most 1 a page\)/);
    assert.equal(cut.body.match(/<section class="draft"/g)?.length, 1);
    assert.ok(!cut.body.includes(second.workflowId), 'a newer draft was shown before the older ones');
  });

  it(
    "holds an edit to its step's own rules, on the page and through decide",
    { timeout: 60_000 },
    async () => {
      const handle = await awaitingRun();
      const edit = (fields: Record<string, string | string[]>) =>
        decide(env.client, handle.workflowId, { action: 'edit', reviewer: 'ana', fields });
      const hundred = Array.from({ length: 100 }, (_, i) => `tag ${i % 50}`);

      const refused = [
        await edit({ tags: hundred }),
        await edit({ tags: Array.from({ length: 21 }, (_, i) => `tag ${i}`) }),
        await edit({ tags: ['a'.repeat(61)] }),
        await edit({ summary: 'x'.repeat(20_001) }),
      ];
      for (const answer of refused) assert.equal(answer.ok, false, JSON.stringify(answer).slice(0, 200));
      const reasons = refused.map((answer) => (answer.ok ? '' : answer.refused));
      assert.match(reasons[0] ?? '', /tag's rules: tags: .*(must not repeat a tag|<=20)/);
      assert.match(reasons[1] ?? '', /tag's rules: tags: Too big: expected array to have <=20 items/);
      assert.match(
        reasons[2] ?? '',
        /tag's rules: tags\.0: Too big: expected string to have <=60 characters/,
      );
      assert.match(reasons[3] ?? '', /summarize's rules: summary: Too big: expected string to have <=20000/);
      assert.equal((await handle.query(reviewQuery))?.decided, undefined);

      // On the page: refused with the step's words, and the reviewer's tags kept in the form.
      const page = await reviewPage();
      const html = await listed(page.url, handle.workflowId);
      const onPage = await post(
        page.url,
        {
          csrf: csrfOf(html, handle.workflowId),
          workflowId: handle.workflowId,
          action: 'edit',
          'field:tags': ['kept tag', 'kept tag'],
        },
        { host: `127.0.0.1:${page.port}` },
      );
      assert.equal(onPage.status, 422, onPage.body.slice(0, 300));
      assert.match(onPage.body, /must not repeat a tag/);
      assert.match(onPage.body, /value="kept tag"/);

      const taken = await edit({ tags: ['checkpoints', 'review'] });
      assert.ok(taken.ok, JSON.stringify(taken));
      assert.deepEqual((await handle.result()).review?.edits, { tags: ['checkpoints', 'review'] });
    },
  );

  it('takes its rules from the step definition: a changed rule changes what an edit may be', () => {
    const [summarize, tag] = modelSteps(steps) as [(typeof steps)[0], (typeof steps)[1]];
    const drafted = { summary: 'A summary.', tags: ['one', 'two'] };
    const fourTags = { tags: ['a', 'b', 'c', 'd'] };
    assert.equal(checkEdit([summarize, tag], drafted, fourTags).ok, true);
    const stricter = defineModelStep({ ...tag, fields: z.object({ tags: z.array(z.string()).max(3) }) });
    const checked = checkEdit([summarize, stricter], drafted, fourTags);
    assert.equal(checked.ok, false);
    assert.match(
      checked.ok ? '' : checked.problem,
      /tag's rules: tags: Too big: expected array to have <=3 items/,
    );
    // A schema that reads a value (here, lowercases it) gives the edit as it reads it.
    const lowering = defineModelStep({
      ...tag,
      fields: z.object({ tags: z.array(z.string().transform((t) => t.toLowerCase())) }),
    });
    assert.deepEqual(checkEdit([summarize, lowering], drafted, { tags: ['Tides'] }), {
      ok: true,
      fields: { tags: ['tides'] },
    });
  });

  it("prints a document's escape sequences inert in npm run review", { timeout: 90_000 }, async () => {
    const title = 'Quarterly notes\u001b[2K\r\u001b[1A\u001b[2Kfake-doc  "Approved by legal"\u009b31m';
    const handle = await awaitingRun({ title });
    const deadline = Date.now() + 30_000;
    let stdout = '';
    while (!stdout.includes(handle.workflowId)) {
      assert.ok(Date.now() < deadline, `npm run review never listed ${handle.workflowId}:\n${stdout}`);
      ({ stdout } = await run(
        process.execPath,
        ['--import', 'tsx', path.join(ROOT, 'src', 'cli', 'review.ts')],
        {
          cwd: ROOT,
          timeout: 60_000,
          env: { ...process.env, TEMPORAL_ADDRESS: env.address, REVIEWER: 'ana', LOG_LEVEL: 'error' },
        },
      ));
    }
    const line = stdout.split('\n').find((l) => l.includes(handle.workflowId)) ?? '';
    assert.doesNotMatch(stdout, /[\u001b\u009b\r]/, 'an escape sequence reached the terminal');
    assert.match(line, /Quarterly notes\\u\{1b\}\[2K\\u\{d\}\\u\{1b\}\[1A/);

    // A tag holding a comma, given once a --tag, is one tag.
    const edited = await run(
      process.execPath,
      [
        '--import',
        'tsx',
        path.join(ROOT, 'src', 'cli', 'review.ts'),
        'edit',
        handle.workflowId,
        '--tag',
        'tides, waves',
        '--tag',
        'moon',
      ],
      {
        cwd: ROOT,
        timeout: 60_000,
        env: { ...process.env, TEMPORAL_ADDRESS: env.address, REVIEWER: 'ana', LOG_LEVEL: 'error' },
      },
    );
    assert.match(edited.stdout, /edited by ana/);
    assert.deepEqual((await handle.result()).review?.edits, { tags: ['tides, waves', 'moon'] });
  });

  it(
    'marks where it cuts a long source, and shows times in UTC and local time',
    { timeout: 60_000 },
    async () => {
      const filler = 'Checkpoints record each finished step. '.repeat(6_000);
      const handle = await awaitingRun({ text: `${SAMPLE_TEXT}\n\n${filler}` });
      const page = await reviewPage();
      const html = await listed(page.url, handle.workflowId);
      assert.match(html, /The source is cut here: \d+ more characters are not shown/);
      assert.match(html, /<time datetime="[^"]+Z">[^<]+ UTC<\/time> \(/);
    },
  );
});

/**
 * Streams `total` bytes (at most `sendAtMost`) to `url` as a form, stopping when answered. A page that has read
 * 64 MiB without answering has buffered what it should have refused: the upload stops there, answered status 0.
 */
function upload(
  url: string,
  total: number,
  headers: Record<string, string>,
  sendAtMost = total,
): Promise<RawAnswer & { sent: number }> {
  const giveUpAt = 64 * 1024 * 1024;
  return new Promise((resolve, reject) => {
    const chunk = Buffer.alloc(256 * 1024, 'a');
    const req = http.request(url, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
      signal: AbortSignal.timeout(20_000),
    });
    let sent = 0;
    let answered = false;
    req.on('response', (res) => {
      answered = true;
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        req.destroy();
        resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8'), sent });
      });
    });
    req.on('error', (err) => {
      if (!answered) reject(err);
    });
    const pump = (): void => {
      while (sent < Math.min(total, sendAtMost) && !answered && !req.destroyed) {
        if (sent >= giveUpAt) {
          answered = true;
          req.destroy();
          resolve({ status: 0, body: `no answer after ${sent} bytes`, sent });
          return;
        }
        sent += chunk.length;
        if (!req.write(chunk)) {
          req.once('drain', pump);
          return;
        }
      }
      if (sent >= total) req.end();
    };
    req.flushHeaders();
    pump();
  });
}
