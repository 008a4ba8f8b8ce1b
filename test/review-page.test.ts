/**
 * The review page in a real browser: headless Chromium from Debian's packages, driven by playwright-core, opens the
 * page, sees a draft beside its source (a document holding `<script>` shows it as text and runs nothing), edits the
 * draft and publishes it; a forged cross-site POST, a POST without the page's form token and a state-changing GET
 * are refused; bound beyond loopback without a token, the page refuses to start. Keeps a screenshot in docs/.
 */
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { chromium } from 'playwright-core';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { startReviewPage } from '../src/runs/review-page';
import { reviewQuery } from '../src/workflow';
import {
  devServerEnv,
  installQuietRuntime,
  pipelineInput,
  pipelineWorker,
  startPipeline,
  tempParts,
} from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

const CHROMIUM = '/usr/bin/chromium';
const SCREENSHOT = path.join(__dirname, '..', 'docs', 'review-page.png');
const defer = cleanupAfterAll();
installQuietRuntime();
let env: TestWorkflowEnvironment;

/** Debian's Chromium, installed by the test run where it is missing (as root, as in CI). */
function ensureChromium(): void {
  if (fs.existsSync(CHROMIUM)) return;
  execFileSync('apt-get', ['install', '-y', '--no-install-recommends', 'chromium'], {
    stdio: 'ignore',
    timeout: 300_000,
  });
}

before(async () => {
  ensureChromium();
  env = await devServerEnv();
  defer(() => env.teardown());
});

const HOSTILE = [
  '# A hostile <script>window.pwned = 1</script> document',
  '',
  'This text holds <script>window.pwned = 2</script> markup and an <img src=x onerror="window.pwned = 3"> tag.',
  'Checkpoints let restarts skip finished steps. Idempotency keys make the unfinished step safe to run twice.',
].join('\n');

describe('the review page', () => {
  it('refuses to listen beyond loopback without a token', async () => {
    await assert.rejects(
      startReviewPage(env.client, (await tempParts(defer)).blobs, { host: '0.0.0.0' }),
      /beyond this machine.*REVIEW_PAGE_TOKEN/,
    );
  });

  it(
    'shows a hostile draft inert, publishes an edit, and refuses forged and tokenless posts',
    { timeout: 180_000 },
    async () => {
      const local = await tempParts(defer);
      const taskQueue = `review-page-${randomUUID()}`;
      const input = {
        ...(await pipelineInput(local.blobs, HOSTILE)),
        review: { timeoutMinutes: 60, onTimeout: 'reject' as const },
      };
      const worker = await pipelineWorker(env, taskQueue, local.deps);
      const handle = await startPipeline(env, taskQueue, input);
      await worker.runUntil(async () => {
        const deadline = Date.now() + 30_000;
        while ((await handle.query(reviewQuery)) === undefined) {
          assert.ok(Date.now() < deadline, 'the draft never came to await review');
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        const reviewPage = await startReviewPage(env.client, local.blobs);
        defer(() => reviewPage.close());

        // Forged: a POST from another site, and one without the page's form token.
        const forged = await fetch(`${reviewPage.url}decide`, {
          method: 'POST',
          headers: { 'content-type': 'application/x-www-form-urlencoded', origin: 'http://evil.example' },
          body: `workflowId=${handle.workflowId}&action=approve&reviewer=mallory&csrf=guess`,
          signal: AbortSignal.timeout(10_000),
        });
        assert.equal(forged.status, 403);
        const tokenless = await fetch(`${reviewPage.url}decide`, {
          method: 'POST',
          headers: { 'content-type': 'application/x-www-form-urlencoded' },
          body: `workflowId=${handle.workflowId}&action=approve&reviewer=mallory`,
          signal: AbortSignal.timeout(10_000),
        });
        assert.equal(tokenless.status, 403);
        const getDecide = await fetch(
          `${reviewPage.url}decide?workflowId=${handle.workflowId}&action=approve`,
          {
            signal: AbortSignal.timeout(10_000),
          },
        );
        assert.equal(getDecide.status, 405);

        const browser = await chromium.launch({
          executablePath: CHROMIUM,
          args: ['--no-sandbox'],
          timeout: 60_000,
        });
        defer(() => browser.close());
        const tab = await browser.newPage({ viewport: { width: 1200, height: 900 } });
        tab.setDefaultTimeout(30_000);
        // The index lags by a moment: reload until the draft is listed.
        for (let tries = 0; ; tries++) {
          await tab.goto(reviewPage.url);
          if ((await tab.locator(`section[data-document="${input.documentId}"]`).count()) > 0) break;
          assert.ok(tries < 60, 'the page never listed the draft');
          await new Promise((resolve) => setTimeout(resolve, 500));
        }
        const card = tab.locator(`section[data-document="${input.documentId}"]`);
        assert.match(await card.locator('pre.source').innerText(), /<script>window\.pwned = 2<\/script>/);
        assert.equal(await tab.evaluate(() => (globalThis as { pwned?: number }).pwned), undefined);
        assert.equal(await tab.locator('img').count(), 0, 'markup in the document became an element');
        // docs/review-page.png is this picture; UPDATE_SCREENSHOT=1 takes it again.
        const shot =
          process.env.UPDATE_SCREENSHOT === '1'
            ? SCREENSHOT
            : path.join(scratchDir(defer, 'page-'), 'page.png');
        await tab.screenshot({ path: shot, fullPage: false });
        assert.ok(fs.statSync(shot).size > 0);

        const edit = card.locator('form.edit');
        await edit.locator('input[name="reviewer"]').fill('ana');
        await edit.locator('textarea[name="summary"]').fill('Reviewed on the page: checkpoints and keys.');
        await edit.locator('input[name="tags"]').fill('checkpoints, review');
        await edit.locator('button').click();
        await tab.waitForURL(/said=/);
        assert.match(await tab.locator('p.said').innerText(), /edited by ana/);

        const result = await handle.result();
        assert.equal(result.review?.outcome, 'edited');
        const stored = await local.store.currentPublication(input.documentId);
        assert.equal(stored?.fields.summary, 'Reviewed on the page: checkpoints and keys.');
        assert.deepEqual(stored?.fields.tags, ['checkpoints', 'review']);
        assert.equal(await local.store.countPublications(), 1);
      });
    },
  );
});
