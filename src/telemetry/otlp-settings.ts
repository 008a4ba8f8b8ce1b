/**
 * Where traces go, read from the OpenTelemetry SDK's standard variables (the "OTLP exporter" and "SDK environment
 * variables" parts of the specification), so a collector is pointed at the way every OpenTelemetry service is:
 *
 * - OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none: no tracing.
 * - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is the full URL; else OTEL_EXPORTER_OTLP_ENDPOINT is the base, and
 *   `/v1/traces` is appended. With neither, nothing is traced unless OTEL_TRACES_EXPORTER=otlp asks for the
 *   specification's default, http://localhost:4318/v1/traces.
 * - OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: `http/protobuf` (the default), or `http/json`.
 * - OTEL_EXPORTER_OTLP_[TRACES_]HEADERS (`key=value,...`, values percent-encoded) and _TIMEOUT (ms, default
 *   10000); the TRACES_ variable wins over the general one. _COMPRESSION (`gzip`) the exporter reads itself.
 * - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (`key=value,...`) describe this process in every span.
 *
 * Called by loadConfig only. Header values are credentials: no message here quotes one.
 */

/** `service.name` unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names another. */
export const DEFAULT_SERVICE_NAME = 'document-pipeline';

/** The specification's default for OTLP over HTTP, used only when OTEL_TRACES_EXPORTER=otlp names no endpoint. */
const DEFAULT_ENDPOINT = 'http://localhost:4318';
const DEFAULT_TIMEOUT_MS = 10_000;

export const OTLP_PROTOCOLS = ['http/protobuf', 'http/json'] as const;
export type OtlpProtocol = (typeof OTLP_PROTOCOLS)[number];

export interface OtlpTarget {
  protocol: OtlpProtocol;
  /** The full URL spans are POSTed to. */
  url: string;
  /** Sent with every export; may hold an API key, so never logged. */
  headers: Record<string, string>;
  timeoutMs: number;
}

export interface TracingSettings {
  /** Undefined: nothing is traced. */
  target: OtlpTarget | undefined;
  /** The resource every span carries: OTEL_RESOURCE_ATTRIBUTES, with `service.name` from OTEL_SERVICE_NAME. */
  resource: Record<string, string>;
}

/** The tracing settings of `env`, or the problem a person has to fix, naming the variable. */
export function readTracingSettings(env: NodeJS.ProcessEnv): TracingSettings | { problem: string } {
  const value = (name: string): string | undefined => {
    const v = env[name]?.trim();
    return v === undefined || v === '' ? undefined : v;
  };
  /** The TRACES_ variable, else the general one: the value and the name it was read from. */
  const either = (suffix: string): [string, string] | undefined => {
    for (const name of [`OTEL_EXPORTER_OTLP_TRACES_${suffix}`, `OTEL_EXPORTER_OTLP_${suffix}`]) {
      const v = value(name);
      if (v !== undefined) return [v, name];
    }
    return undefined;
  };

  const attributes = parseList(value('OTEL_RESOURCE_ATTRIBUTES'), 'OTEL_RESOURCE_ATTRIBUTES');
  if ('problem' in attributes) return attributes;
  const resource = {
    ...attributes.entries,
    'service.name': value('OTEL_SERVICE_NAME') ?? attributes.entries['service.name'] ?? DEFAULT_SERVICE_NAME,
  };

  const exporters = (value('OTEL_TRACES_EXPORTER') ?? 'otlp')
    .toLowerCase()
    .split(',')
    .map((s) => s.trim());
  const unknown = exporters.filter((e) => e !== 'otlp' && e !== 'none');
  if (unknown.length > 0) {
    return {
      problem:
        `OTEL_TRACES_EXPORTER=${unknown.join(',')} is not an exporter this project has: use otlp (to the ` +
        'OTEL_EXPORTER_OTLP_* collector) or none',
    };
  }
  const disabled =
    value('OTEL_SDK_DISABLED')?.toLowerCase() === 'true' || exporters.every((e) => e === 'none');
  const explicitlyOtlp = value('OTEL_TRACES_EXPORTER') !== undefined && exporters.includes('otlp');
  const tracesEndpoint = value('OTEL_EXPORTER_OTLP_TRACES_ENDPOINT');
  const baseEndpoint = value('OTEL_EXPORTER_OTLP_ENDPOINT');
  if (disabled || (tracesEndpoint === undefined && baseEndpoint === undefined && !explicitlyOtlp)) {
    return { target: undefined, resource };
  }

  const [protocol, protocolVariable] = either('PROTOCOL') ?? ['http/protobuf', 'OTEL_EXPORTER_OTLP_PROTOCOL'];
  if (protocol === 'grpc') {
    return {
      problem:
        `${protocolVariable}=grpc: this project exports traces over OTLP/HTTP only (no gRPC exporter is ` +
        `installed); set ${protocolVariable}=http/protobuf and point the endpoint at the collector's HTTP port ` +
        '(4318 on most collectors)',
    };
  }
  if (!isProtocol(protocol)) {
    return {
      problem: `${protocolVariable}=${protocol} is not an OTLP protocol: use http/protobuf (the default) or http/json`,
    };
  }

  let url: string;
  let urlVariable: string;
  if (tracesEndpoint !== undefined) {
    url = tracesEndpoint;
    urlVariable = 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT';
  } else {
    // The base URL gets the signal's path, whatever path it already has (the specification's rule).
    url = `${(baseEndpoint ?? DEFAULT_ENDPOINT).replace(/\/+$/, '')}/v1/traces`;
    urlVariable = 'OTEL_EXPORTER_OTLP_ENDPOINT';
  }
  const urlProblem = checkUrl(url);
  if (urlProblem !== undefined) return { problem: `${urlVariable}: ${urlProblem}` };

  const headers: Record<string, string> = {};
  for (const name of ['OTEL_EXPORTER_OTLP_HEADERS', 'OTEL_EXPORTER_OTLP_TRACES_HEADERS']) {
    const parsed = parseList(value(name), name);
    if ('problem' in parsed) return parsed;
    Object.assign(headers, parsed.entries);
  }

  const [timeoutText, timeoutVariable] = either('TIMEOUT') ?? [String(DEFAULT_TIMEOUT_MS), ''];
  const timeoutMs = Number(timeoutText);
  if (!Number.isInteger(timeoutMs) || timeoutMs <= 0) {
    return { problem: `${timeoutVariable}=${timeoutText} must be a positive whole number of milliseconds` };
  }

  return { target: { protocol, url, headers, timeoutMs }, resource };
}

function isProtocol(s: string): s is OtlpProtocol {
  return (OTLP_PROTOCOLS as readonly string[]).includes(s);
}

/** Why `url` cannot be an export URL, or undefined. A credential in it would be shown in logs: headers carry those. */
function checkUrl(url: string): string | undefined {
  if (!URL.canParse(url)) return 'is not a URL';
  const parsed = new URL(url);
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:')
    return 'must be an http:// or https:// URL';
  if (parsed.username !== '' || parsed.password !== '') {
    return (
      'must not carry a user name or password (URLs are shown in messages and logs): send credentials as ' +
      'headers instead (OTEL_EXPORTER_OTLP_HEADERS)'
    );
  }
  return undefined;
}

/**
 * `key=value,key2=value2`, the W3C baggage-like list both OTEL_RESOURCE_ATTRIBUTES and the headers variables use,
 * values percent-decoded. A bad entry is named by its position, never quoted: it may be a credential.
 */
function parseList(
  text: string | undefined,
  variable: string,
): { entries: Record<string, string> } | { problem: string } {
  const entries: Record<string, string> = {};
  if (text === undefined) return { entries };
  const parts = text.split(',');
  for (const [i, part] of parts.entries()) {
    if (part.trim() === '') continue;
    const eq = part.indexOf('=');
    const key = eq === -1 ? '' : part.slice(0, eq).trim();
    if (key === '') return { problem: `${variable}: entry ${i + 1} is not key=value` };
    try {
      entries[decodeURIComponent(key)] = decodeURIComponent(part.slice(eq + 1).trim());
    } catch {
      return { problem: `${variable}: entry ${i + 1} has a broken percent-encoding` };
    }
  }
  return { entries };
}
