import { loadClientConnectConfig } from '@temporalio/envconfig';
import type { NativeConnectionOptions } from '@temporalio/worker';

/** What clients and workers need to reach a server: the address and, for secured clusters, TLS and API key. */
export interface TemporalSettings {
  /** Undefined when neither TEMPORAL_ADDRESS nor a profile names a server. */
  address: string | undefined;
  /** The profile's namespace, else TEMPORAL_NAMESPACE, else `default`. */
  namespace: string;
  /** TLS, mTLS client certificate, API key and gRPC metadata, as `Connection.connect` and `NativeConnection.connect` take them. */
  secure: Pick<NativeConnectionOptions, 'tls' | 'apiKey' | 'metadata'>;
}

/**
 * Reads the connection the standard Temporal way (`@temporalio/envconfig`): a profile from the TOML config file
 * (TEMPORAL_CONFIG_FILE, else ~/.config/temporalio/temporal.toml; TEMPORAL_PROFILE picks one), overridden by
 * TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS*, TEMPORAL_GRPC_META_*. So a hosted or
 * mTLS cluster is a matter of configuration, not code. Called by loadConfig only; never log the result: it may
 * hold the API key.
 */
export function readTemporalSettings(env: NodeJS.ProcessEnv, defaultNamespace = 'default'): TemporalSettings {
  const variables: Record<string, string> = {};
  for (const [name, value] of Object.entries(env))
    if (value !== undefined && value !== '') variables[name] = value;
  const { connectionOptions, namespace } = loadClientConnectConfig({
    profile: variables.TEMPORAL_PROFILE,
    overrideEnvVars: variables,
  });
  const { address, tls, apiKey, metadata } = connectionOptions;
  return {
    address,
    namespace: namespace ?? defaultNamespace,
    secure: {
      ...(tls !== undefined ? { tls } : {}),
      ...(apiKey !== undefined ? { apiKey } : {}),
      ...(metadata !== undefined ? { metadata } : {}),
    },
  };
}
