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

/** The configured server, or localhost:7233 when none is named. */
export function configuredEndpoint(config: Pick<Config, 'temporal'>): TemporalEndpoint {
  const { address, namespace, secure } = config.temporal;
  return { address: address ?? DEFAULT_TEMPORAL_ADDRESS, namespace, secure };
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
  config: Pick<Config, 'temporal' | 'payloadEncryption'>,
  {
    endpoint = configuredEndpoint(config),
    connectTimeout,
  }: { endpoint?: TemporalEndpoint; connectTimeout?: Duration } = {},
): Promise<ConnectedClient> {
  const connection = await Connection.connect({
    address: endpoint.address,
    ...endpoint.secure,
    ...(connectTimeout !== undefined ? { connectTimeout } : {}),
  }).catch((err: unknown) => {
    throw connectionFailure(endpoint, err);
  });
  const dataConverter = dataConverterFor(config);
  // With tracing started in this process, starting a run opens the document's trace (src/telemetry/tracing.ts).
  const interceptors = { workflow: clientTracingInterceptors() };
  const client = new Client({ connection, namespace: endpoint.namespace, dataConverter, interceptors });
  return { client, endpoint, dataConverter, close: () => connection.close() };
}

/** The native connection a worker polls over, to `endpoint` (the configured server by default). */
export function connectWorker(
  config: Pick<Config, 'temporal'>,
  endpoint: TemporalEndpoint = configuredEndpoint(config),
): Promise<NativeConnection> {
  return NativeConnection.connect({ address: endpoint.address, ...endpoint.secure }).catch((err: unknown) => {
    throw connectionFailure(endpoint, err);
  });
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
 * A connection that could not be made, as what to do about it; the transport's own words (a Rust error chain, or
 * grpc's "Failed to connect before the deadline") are kept as the cause, shortened to what matters. A server
 * that answered and refused (a bad API key, a TLS mismatch) is told apart from no server at all: starting one
 * is no fix for the first.
 */
export function connectionFailure({ address }: TemporalEndpoint, err: unknown): unknown {
  if (!(err instanceof Error)) return err;
  const text = err.message;
  const quoted = /message: "([^"]+)"/.exec(text)?.[1];
  if (/Unauthenticated|PermissionDenied|tls|certificate|handshake/i.test(text)) {
    const reason = quoted ?? /tls|certificate|handshake/i.exec(text)?.[0] ?? text;
    return new ConnectionFailure(
      `The Temporal server at ${address} did not accept this connection (${reason}): check TEMPORAL_API_KEY, ` +
        'the TEMPORAL_TLS_* settings and TEMPORAL_NAMESPACE',
      reason,
      { cause: err },
    );
  }
  const reason =
    quoted ??
    /dns error/i.exec(text)?.[0] ??
    (/before the deadline/.test(text) ? 'nothing answered in time' : undefined);
  if (err.name !== 'TransportError' && reason === undefined) return err;
  return new ConnectionFailure(
    `No Temporal server answers at ${address}${reason === undefined ? '' : ` (${reason})`}: start one with ` +
      '`npm run server` (the embedded server, until Ctrl-C), or set TEMPORAL_ADDRESS',
    reason ?? text,
    { cause: err },
  );
}
