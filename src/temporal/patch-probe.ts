/**
 * Bundled by `npm run check-replay` only, in place of `@temporalio/workflow` for the workflow code (never by a
 * worker): the same module, except that `patched` also tells a sink what it answered. During replay `patched`
 * answers false exactly when the run's history went past the call without the patch's marker, that is when the
 * run took the old branch, so the check learns which runs still need it from the runs themselves.
 */
import { patched as sdkPatched, proxySinks } from '@temporalio/workflow/lib/index';
import type { Sinks } from '@temporalio/workflow/lib/index';

export * from '@temporalio/workflow/lib/index';

export interface PatchProbeSinks extends Sinks {
  patchProbe: { patched(patchId: string, taken: boolean): void };
}

const { patchProbe } = proxySinks<PatchProbeSinks>();

export function patched(patchId: string): boolean {
  const taken = sdkPatched(patchId);
  patchProbe.patched(patchId, taken);
  return taken;
}
