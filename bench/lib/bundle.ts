import { bundleWorkflowCode } from '@temporalio/worker';

/** A logger that drops the bundler's progress lines. */
export const silent = { log() {}, trace() {}, debug() {}, info() {}, warn() {}, error() {} };

/** The workflow code at `workflowsPath`, bundled from source as a worker without a prebuilt bundle does. */
export async function bundleFromSource(workflowsPath: string): Promise<string> {
  return (await bundleWorkflowCode({ workflowsPath, logger: silent })).code;
}
