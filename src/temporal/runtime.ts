import { DefaultLogger, Runtime } from '@temporalio/worker';

/** Keeps the SDK's own logs to warnings and errors, so the pipeline's progress lines stay readable. */
export function quietSdkLogs(): void {
  Runtime.install({ logger: new DefaultLogger('WARN') });
}
