import { Client, Connection } from '@temporalio/client';
import { NativeConnection } from '@temporalio/worker';
import type { DataConverter, Duration } from '@temporalio/common';
import type { Config } from '../config';
import { UserFacingError } from '../lib/run-main';
import type { TemporalSettings } from './settings';
import { clientTracingInterceptors } from '../telemetry/tracing';
import { dataConverterFor } from './codec';

/** Where `npm run worker`, `pipeline` and `report` look when nothing names a server. */
export const DEFAULT_TEMPORAL_ADDRESS = 'localhost:7233';

/** A server to talk to: its address, namespace and (for a configured cluster) TLS and API key. */
export interface TemporalEndpoint {
  address: string;
  namespace: string;
  secure: TemporalSettings['secure'];
}

/**
 * The configured server; when none is named, the one `npm run server` starts, on EMBEDDED_TEMPORAL_PORT
 * (localhost:7233 by default), as its message says.
 */
export function configuredEndpoint(
  config: Pick<Config, 'temporal'> & { embeddedPort?: number },
): TemporalEndpoint {
  const { address, namespace, secure } = config.temporal;
  const embedded =
    config.embeddedPort === undefined ? DEFAULT_TEMPORAL_ADDRESS : `localhost:${config.embeddedPort}`;
  return { address: address ?? embedded, namespace, secure };
}

export interface ConnectedClient {
  client: Client;
  endpoint: TemporalEndpoint;
  /** The payload codec setup the client uses; workers in the same process take the same. */
  dataConverter: DataConverter | undefined;
  close(): Promise<void>;
}

/**
 * A client for `endpoint` (the configured server by default) with the project's data converter, so it reads and
 * writes payloads as the workers do. Every entry point connects through here; `close` ends the connection.
 */
export async function connectClient(
  config: Pick<Config, 'temporal' | 'payloadEncryption'> & { embeddedPort?: number },
  {
    endpoint = configuredEndpoint(config),
    connectTimeout,
  }: { endpoint?: TemporalEndpoint; connectTimeout?: Duration } = {},
): Promise<ConnectedClient> {
  const connection = await Connection.connect({
    address: endpoint.address,
    ...endpoint.secure,
    ...(connectTimeout !== undefined ? { connectTimeout } : {}),
  }).catch(async (err: unknown) => {
    throw connectionFailure(endpoint, await withLastTransportError(endpoint, err));
  });
  const dataConverter = dataConverterFor(config);
  // With tracing started in this process, starting a run opens the document's trace (src/telemetry/tracing.ts).
  const interceptors = { workflow: clientTracingInterceptors() };
  const client = new Client({ connection, namespace: endpoint.namespace, dataConverter, interceptors });
  return { client, endpoint, dataConverter, close: () => connection.close() };
}

/** The native connection a worker polls over, to `endpoint` (the configured server by default). */
export function connectWorker(
  config: Pick<Config, 'temporal'> & { embeddedPort?: number },
  endpoint: TemporalEndpoint = configuredEndpoint(config),
): Promise<NativeConnection> {
  return NativeConnection.connect({ address: endpoint.address, ...endpoint.secure }).catch(
    async (err: unknown) => {
      throw connectionFailure(endpoint, await withLastTransportError(endpoint, err));
    },
  );
}

/** A connection that could not be made: its message says what to do, `reason` the transport's few words. */
export class ConnectionFailure extends UserFacingError {
  override name = 'ConnectionFailure';

  constructor(
    message: string,
    readonly reason: string,
    options: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** Why connecting failed, in a few words, for a command that says in its own words what to do about it. */
export function connectionReason(err: unknown): string {
  if (err instanceof ConnectionFailure) return err.reason;
  return err instanceof Error ? err.message : String(err);
}

/**
 * grpc-js says only "Failed to connect before the deadline" of a channel that never became ready, dropping why: a
 * TLS certificate it refused, a handshake the server cut off; the worker's native connection says at times only
 * "operation was canceled" of a handshake the server refused. One call on a fresh channel that does not wait for it
 * to be ready fails with the channel's last error instead; asked only after such a failure over TLS, to say which.
 */
async function withLastTransportError(endpoint: TemporalEndpoint, err: unknown): Promise<unknown> {
  if (!(err instanceof Error) || !endpoint.secure.tls) return err;
  if (!/before the deadline|operation was canceled/.test(messagesOf(err))) return err;
  // No retry interceptor: the call must fail with what the channel saw, not try again until its deadline.
  const probe = Connection.lazy({ address: endpoint.address, ...endpoint.secure, interceptors: [] });
  try {
    await probe.withDeadline(Date.now() + 5_000, () => probe.workflowService.getSystemInfo({}));
    return err;
  } catch (probed) {
    const last =
      probed instanceof Error
        ? /Last error: (.*?)(?: \(\d{4}-[^)]*\))?\. Resolution/s.exec(probed.message)
        : null;
    if (last?.[1] === undefined) return err;
    // Named as the failure it explains, so that it is read as the same kind of failure (see connectionFailure).
    const explained = new Error(`${err.message}; last error: ${last[1].trim()}`, { cause: err });
    explained.name = err.name;
    return explained;
  } finally {
    await probe.close();
  }
}

/** Readable words for a server certificate refused, from rustls (workers) and OpenSSL (clients) alike. */
const UNTRUSTED_SERVER =
  /InvalidCertificate\((\w+)\)|(self-signed certificate in certificate chain|unable to get local issuer certificate|unable to verify the first certificate|certificate has expired|Hostname\/IP does not match certificate's altnames[^.]*)/;
/** The server's TLS alert for a client that sent no certificate. */
const CLIENT_CERT_REQUIRED = /CertificateRequired|alert certificate required/;
/** A server that answered and refused the API key (or the namespace), in gRPC's words from either client. */
const CREDENTIALS_REFUSED =
  /Unauthenticated|PermissionDenied|PERMISSION_DENIED|valid authentication credentials|does not have permission/i;
/** A connection over TLS that ended before an answer: the handshake cut off, as servers refuse client certificates. */
const DROPPED_DURING_TLS =
  /BrokenPipe|ConnectionReset|UnexpectedEof|close_notify|ECONNRESET|Failed to connect$/m;

/**
 * A connection that could not be made, as what to do about it; the transport's own words (a Rust error chain, or
 * grpc's "Failed to connect before the deadline") are kept as the cause, shortened to what matters. A server
 * that answered and refused (a bad API key, a TLS mismatch) is told apart from no server at all: starting one
 * is no fix for the first. A certificate this process does not trust and a client certificate the server wants
 * each name the settings that fix them.
 */
export function connectionFailure({ address, secure }: TemporalEndpoint, err: unknown): unknown {
  if (!(err instanceof Error)) return err;
  // The client wraps a refusal ("Failed to connect to Temporal server") around the gRPC status that says why.
  const text = messagesOf(err);
  const failure = (message: string, reason: string): ConnectionFailure =>
    new ConnectionFailure(message, reason, { cause: err });
  const untrusted = UNTRUSTED_SERVER.exec(text);
  if (untrusted !== null) {
    const reason = untrusted[1] ?? untrusted[2] ?? 'untrusted certificate';
    return failure(
      `The Temporal server at ${address} presented a TLS certificate this process does not trust (${reason}): ` +
        'set TEMPORAL_TLS_SERVER_CA_CERT_PATH to the CA that signed it and TEMPORAL_TLS_SERVER_NAME to a name it ' +
        'was issued for',
      reason,
    );
  }
  const wantsCert = CLIENT_CERT_REQUIRED.exec(text)?.[0];
  if (wantsCert !== undefined) {
    return failure(
      `The Temporal server at ${address} requires a client certificate (mTLS) and got none (${wantsCert}): set ` +
        'TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH to a certificate and key its CA signed',
      wantsCert,
    );
  }
  const quoted =
    /message: "([^"]+)"/.exec(text)?.[1] ??
    /\b(?:UNAUTHENTICATED|PERMISSION_DENIED): ([^\n]+)/.exec(text)?.[1];
  const refused = (reason: string): ConnectionFailure =>
    failure(
      `The Temporal server at ${address} did not accept this connection (${reason}): check TEMPORAL_API_KEY, ` +
        'the TEMPORAL_TLS_* settings and TEMPORAL_NAMESPACE',
      reason,
    );
  if (CREDENTIALS_REFUSED.test(text)) return refused(quoted ?? text);
  const dropped = secure.tls ? DROPPED_DURING_TLS.exec(text)?.[0] : undefined;
  if (dropped !== undefined) {
    return failure(
      `The Temporal server at ${address} closed the connection during the TLS handshake (${dropped}): it may ` +
        'require a client certificate (TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH) or refuse ' +
        'the one given, or not speak TLS on that port',
      dropped,
    );
  }
  const tlsWords = /tls|certificate|handshake/i.exec(text)?.[0];
  if (tlsWords !== undefined) return refused(quoted ?? tlsWords);
  const reason =
    quoted ??
    /dns error/i.exec(text)?.[0] ??
    (/before the deadline/.test(text) ? 'nothing answered in time' : undefined);
  if (err.name !== 'TransportError' && reason === undefined) return err;
  return failure(
    `No Temporal server answers at ${address}${reason === undefined ? '' : ` (${reason})`}: start one with ` +
      '`npm run server` (the embedded server, until Ctrl-C), or set TEMPORAL_ADDRESS',
    reason ?? err.message,
  );
}

/** An error's message and its causes', one a line. */
function messagesOf(err: Error): string {
  const lines = [err.message];
  for (let cause = err.cause; cause instanceof Error && lines.length < 5; cause = cause.cause)
    lines.push(cause.message);
  return lines.join('\n');
}
