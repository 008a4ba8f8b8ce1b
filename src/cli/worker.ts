import { loadConfig } from '../config';
import { runMain } from '../lib/run-main';
import { quietSdkLogs } from '../temporal/runtime';
import { servePipeline } from '../temporal/serve';

/** `npm run worker`: a worker only, against TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE (default localhost:7233). */
async function run(): Promise<void> {
  quietSdkLogs();
  await servePipeline(loadConfig());
}

runMain(run);
