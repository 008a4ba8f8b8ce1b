import './compose';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { loadConfig } from '../config';
import type { Config } from '../config';
import { startReviewPage } from '../runs/review-page';
import { openStores } from '../store/open';
import type { JsonValue } from '../contract';
import { runMain, UserFacingError } from '../lib/run-main';
import { formatCost } from '../model/pricing';
import { describeOutcome } from '../contract/review';
import type { ReviewDecision } from '../contract/review';
import {
  awaitingCount,
  awaitingReview,
  decide,
  reviewedWorkflowId,
  ServerUnavailableError,
} from '../runs/review-queue';
import { connectClient } from '../temporal/connection';

const USAGE = [
  'Usage:',
  '  npm run review                                          the drafts awaiting review, oldest first',
  '  npm run review -- approve <document>...                 publish the drafts as they are',
  '  npm run review -- reject <document>... --reason "..."   publish nothing; the reason is kept',
  '  npm run review -- edit <document>... [--summary "..."] [--tag a --tag b]  publish with these fields instead',
  '  npm run review -- serve [--host H] [--port N]          the review page (loopback, port 8790, by default)',
  'A decision records who made it: the REVIEWER setting, else your login name. <document> is a document ID or',
  'its workflow ID (document-<id>), as the list shows.',
].join('\n');

/**
 * `npm run review`: a person's review before publish. Runs started with a review (REVIEW=on) wait with their draft
 * until someone approves, edits or rejects it here (or on the review page), or until their deadline.
 */
async function run(): Promise<void> {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: {
      reviewer: { type: 'string' },
      reason: { type: 'string' },
      summary: { type: 'string' },
      tags: { type: 'string' },
      tag: { type: 'string', multiple: true },
      host: { type: 'string' },
      port: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help === true) {
    console.log(USAGE);
    return;
  }
  // Who decides is the configured identity, never a name typed beside the decision: anyone could type any name.
  if (values.reviewer !== undefined)
    throw new UserFacingError(
      '--reviewer is not accepted: a decision records the configured identity. Set REVIEWER (in the environment) ' +
        `to the name to decide under; without it, your login name (${os.userInfo().username}) is used.`,
    );
  const [command = 'list', ...documents] = positionals;
  const config = loadConfig();
  const reviewer = config.reviewer ?? os.userInfo().username;
  if (command === 'serve') return serve(config, { ...values, reviewer });
  if (command !== 'list' && (!['approve', 'reject', 'edit'].includes(command) || documents.length === 0))
    throw new UserFacingError(USAGE);
  const decision = decisionOf(command, reviewer, values);
  const { client, close } = await connectClient(config, { connectTimeout: '10 seconds' });
  try {
    if (decision === undefined) {
      const [queue, total] = await Promise.all([awaitingReview(client), awaitingCount(client)]);
      const unanswered = queue.unanswered ?? [];
      const failed = queue.failed ?? [];
      const shown = queue.length + unanswered.length + failed.length;
      if (total !== undefined && total > shown)
        console.log(
          `Showing the ${shown} oldest of the ${total} runs awaiting review: decide these, then list again.`,
        );
      if (shown === 0) console.log('Nothing awaits review.');
      for (const { workflowId, error } of failed)
        console.error(`${workflowId} awaits review, but its draft could not be read: ${error}`);
      if (failed.length > 0) process.exitCode = 1;
      if (unanswered.length > 0)
        console.log(
          `${unanswered.length} run(s) await review, but no worker answered for their drafts: start one ` +
            `(npm run worker) and list again. ${unanswered.map(inert).join(', ')}`,
        );
      for (const { workflowId, draft } of queue) {
        const cost = draft.costUsd === null ? 'no price' : formatCost(draft.costUsd);
        // What a document holds is printed inert: its escape sequences cannot move the cursor or redraw a line.
        console.log(`${inert(draft.documentId)}  "${inert(draft.title)}"  (${inert(workflowId)})`);
        console.log(
          `  ${draft.model.provider}/${draft.model.model}, ${cost}; waiting since ` +
            `${new Date(draft.awaitingSince).toISOString()}, deadline ${new Date(draft.deadline).toISOString()} ` +
            `(then ${draft.onTimeout === 'publish' ? 'published as drafted' : 'rejected'})`,
        );
        for (const [name, value] of Object.entries(draft.fields))
          console.log(
            `  ${inert(name)}: ${Array.isArray(value) ? inert(JSON.stringify(value)) : inert(String(value))}`,
          );
      }
      return;
    }
    let refused = 0;
    for (const document of documents) {
      const workflowId = reviewedWorkflowId(document);
      const answer = await decide(client, workflowId, decision);
      if (answer.ok) console.log(`${inert(document)}: ${inert(describeOutcome(answer.outcome))}`);
      else {
        refused++;
        console.error(`${inert(document)}: refused: ${inert(answer.refused)}`);
      }
    }
    if (refused > 0) process.exitCode = 1;
  } catch (err) {
    if (err instanceof ServerUnavailableError) throw new UserFacingError(err.message);
    throw err;
  } finally {
    await close();
  }
}

/** Serves the review page until Ctrl-C. */
async function serve(
  config: Config,
  values: { host?: string; port?: string; reviewer: string },
): Promise<void> {
  const port = Number(values.port ?? 8790);
  if (!Number.isInteger(port) || port < 0 || port > 65_535)
    throw new UserFacingError(`--port must be a port number, not "${values.port}"`);
  const { client, close } = await connectClient(config, { connectTimeout: '10 seconds' });
  const stores = await openStores(config);
  let page;
  try {
    page = await startReviewPage(client, stores.blobs, {
      host: values.host ?? '127.0.0.1',
      port,
      token: config.reviewPageToken,
      publicOrigin: config.reviewPageOrigin,
      keyFile: config.paths.reviewPageKey,
      reviewer: values.reviewer,
    });
  } catch (err) {
    await stores.close();
    await close();
    throw new UserFacingError(err instanceof Error ? err.message : String(err));
  }
  console.log(`Review page: ${page.url} (Ctrl-C stops it)`);
  const opened = page;
  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  await opened.close();
  await stores.close();
  await close();
}

/** The decision the command line gives, undefined for the list. */
function decisionOf(
  command: string,
  reviewer: string,
  values: { reason?: string; summary?: string; tags?: string; tag?: string[] },
): ReviewDecision | undefined {
  if (command === 'approve') return { action: 'approve', reviewer };
  if (command === 'reject') {
    if (values.reason === undefined)
      throw new UserFacingError('reject needs --reason "...": why it is rejected');
    return { action: 'reject', reviewer, reason: values.reason };
  }
  if (command === 'edit') {
    const fields: Record<string, JsonValue> = {};
    if (values.summary !== undefined) fields.summary = values.summary;
    // --tag once a tag keeps a comma inside a tag; --tags "a, b" is the short form for tags without one.
    if (values.tag !== undefined || values.tags !== undefined)
      fields.tags = [
        ...(values.tag ?? []),
        ...(values.tags ?? '')
          .split(',')
          .map((t) => t.trim())
          .filter((t) => t !== ''),
      ];
    if (Object.keys(fields).length === 0)
      throw new UserFacingError(
        'edit needs --summary "..." or --tag a --tag b (or both): what to publish instead',
      );
    return { action: 'edit', reviewer, fields };
  }
  return undefined;
}

/**
 * A text as a terminal shows it inert: control characters (ESC and the other C0 and C1 codes) and the bidirectional
 * overrides written as `\u{1b}`, so a document cannot erase a line, move the cursor or reorder what is printed.
 */
function inert(text: string): string {
  return text.replace(
    /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]|\n|\t/g,
    (c) => (c === '\n' ? ' ' : c === '\t' ? ' ' : `\\u{${c.charCodeAt(0).toString(16)}}`),
  );
}

runMain(run);
