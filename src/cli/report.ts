import './compose';
import path from 'node:path';
import { WorkflowNotFoundError } from '@temporalio/common';
import { loadConfig } from '../config';
import { configuredEndpoint, connectClient, connectionReason } from '../temporal/connection';
import type { ConnectedClient } from '../temporal/connection';
import { formatReport } from '../runs/report-format';
import { agentLines } from '../runs/agent-lines';
import { markSkippedOnResume, pendingSteps, recoveryReport, runDetails } from '../runs/history';
import { withDecodedResults } from '../runs/decode-history';
import { reviewQuery } from '../workflow/queries';
import { describeOutcome, describeReview } from '../contract/review';
import type { DocumentPipeline } from '../contract';
import { runMain } from '../lib/run-main';

const USAGE =
  'Usage: npm run report -- <workflow ID> [run ID]\n' +
  'e.g. npm run report -- document-sha256-0123456789abcdef01234567 (the IDs `npm start` prints)';

/**
 * `npm run report -- <workflow ID> [run ID]`: what crashes did to one run, read from its event history on the
 * server at TEMPORAL_ADDRESS (default localhost:7233): per step the attempts, the worker of the recorded
 * attempt, the idempotency key, whether it was skipped on resume, reused from the memo or rerun, the time lost
 * and the last failure; and the run's outcome.
 */
async function run(): Promise<void> {
  const [workflowId, runId] = process.argv.slice(2);
  if (workflowId === undefined || workflowId === '' || workflowId.startsWith('-')) {
    console.error(USAGE);
    process.exitCode = 2;
    return;
  }
  const config = loadConfig();
  const { address, namespace } = configuredEndpoint(config);
  let connected: ConnectedClient;
  try {
    connected = await connectClient(config, { connectTimeout: '5 seconds' });
  } catch (err) {
    const why = connectionReason(err);
    // npm start's embedded server stops with its run; npm run server serves the same database until Ctrl-C.
    const advice =
      config.temporal.address === undefined
        ? `The runs npm start recorded are in ${path.relative(process.cwd(), config.paths.temporal) || config.paths.temporal}: ` +
          'start `npm run server` (it serves them until Ctrl-C) and run this again.'
        : 'Is the server TEMPORAL_ADDRESS names up? Unset TEMPORAL_ADDRESS to read the runs npm start recorded ' +
          '(with `npm run server` running).';
    console.error(`Cannot reach a Temporal server at ${address} (${why}). ${advice}`);
    process.exitCode = 1;
    return;
  }
  const { client, close } = connected;
  try {
    const handle = client.workflow.getHandle(workflowId, runId);
    let description;
    try {
      description = await handle.describe();
    } catch (err) {
      if (!(err instanceof WorkflowNotFoundError)) throw err;
      console.error(
        `No workflow "${workflowId}"${runId ? ` with run ${runId}` : ''} in namespace "${namespace}" ` +
          `at ${address}. Workflow IDs look like document-<document ID>; list them with ` +
          `\`temporal workflow list --address ${address}\`.`,
      );
      process.exitCode = 1;
      return;
    }
    const history = await withDecodedResults(await handle.fetchHistory(), client.options.loadedDataConverter);
    const details = runDetails(history);
    const report = markSkippedOnResume(recoveryReport(history, 0, description.runId), details);
    const pending = pendingSteps(description.raw.pendingActivities);
    // A completed run's result says how its review ended and what was published, with no worker needed.
    const result =
      description.status.name === 'COMPLETED'
        ? await client.workflow
            .getHandle<DocumentPipeline>(workflowId, description.runId)
            .result()
            .catch(() => undefined)
        : undefined;
    for (const line of formatReport(workflowId, report, details, pending, result?.review)) console.log(line);
    // An agent step's loop, from the run's result (a completed run's result is read from its history).
    if (result !== undefined) for (const line of agentLines(result)) console.log(`Agent ${line}`);
    if (result?.review !== undefined) {
      console.log(`\nReview: ${describeOutcome(result.review)}`);
      for (const [name, value] of Object.entries(result.review.edits ?? {}))
        console.log(
          `  published ${name} (the reviewer's edit): ${Array.isArray(value) ? value.join(', ') : String(value)}`,
        );
      return;
    }
    // An open run with a review says where it stands (a query: a worker answers it).
    const review = await client
      .withDeadline(Date.now() + 10_000, () => handle.query(reviewQuery))
      .catch(() => undefined);
    if (review !== undefined) console.log(`\n${describeReview(review)}`);
  } finally {
    await close();
  }
}

runMain(run);
