import path from 'node:path';
import { z } from 'zod';
import { chooseModel } from './model/choose';
import type { ModelSettings } from './model/choose';
import { DEFAULT_PRICES, PriceTableSchema } from './model/pricing';
import type { PriceTable } from './model/pricing';
import { DEFAULT_TASK_QUEUE } from './contract';
import { DocumentExtensionsSchema } from './documents/files';
import { isValidSecret, SECRET_FORMAT } from './publisher/signature';
import { readTemporalSettings } from './temporal/settings';
import type { BulkSettings } from './contract/batch';
import { MAX_REVIEW_MINUTES, REVIEW_POLICIES } from './contract/review';
import type { ReviewSettings } from './contract/review';
import { AGENT_LIMITS } from './contract/agent';
import type { AgentSettings } from './contract/agent';
import { readTracingSettings } from './telemetry/otlp-settings';
import type { TracingSettings } from './telemetry/otlp-settings';
import type { TemporalSettings } from './temporal/settings';

/** Levels of LOG_LEVEL, from the most to the least verbose. */
export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Default ports of the embedded dev server; docker-compose.yml publishes the same ones. */
export const DEFAULT_TEMPORAL_PORT = 7233;
export const DEFAULT_UI_PORT = 8233;

/**
 * An http(s) URL, or unset. A user name or password in it is refused: URLs end up in messages and logs, so the
 * credential goes where `credentialGoes` says.
 */
const optionalUrl = (credentialGoes: string) =>
  z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === '' ? undefined : s))
    .pipe(
      z
        .url({ protocol: /^https?$/ })
        .refine((url) => {
          if (!URL.canParse(url)) return true; // the url check above already says what is wrong
          const { username, password } = new URL(url);
          return username === '' && password === '';
        }, `must not carry a user name or password (URLs are shown in messages and logs): ${credentialGoes}`)
        .optional(),
    );

const optionalText = z
  .string()
  .trim()
  .transform((s) => (s === '' ? undefined : s))
  .optional();

/** A positive whole number; unset or empty (as compose's `${VAR:-}` gives) means the default. */
const positiveInt = (fallback: number) =>
  z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? fallback : Number(s)))
    .pipe(z.number().int().positive());

/** A positive whole number, or unset (nothing set: learned or none). */
const optionalPositiveInt = z
  .string()
  .trim()
  .optional()
  .transform((s) => (s === undefined || s === '' ? undefined : Number(s)))
  .pipe(z.number({ error: 'must be a whole number' }).int().positive().optional());

const LOOKUP_EXAMPLE = 'e.g. https://receiver.example.com/publications/{key}';

/**
 * Why a PUBLISH_WEBHOOK_LOOKUP_URL cannot be asked, saying what to fix; undefined when it can. The publisher
 * percent-encodes the key into `{key}`, so `{key}` must be one whole path segment: in the host, the query or the
 * fragment, or beside other text in its segment, the receiver would be asked about something else, and with a
 * trailing `/` it answers its "no such route" 404, which reads as "no such delivery". A query string of the
 * receiver's own (`?token=...`) is kept and sent with every lookup.
 */
export function lookupUrlProblem(template: string): string | undefined {
  const slots = template.split('{key}').length - 1;
  if (slots === 0) {
    return `must have {key} where the Idempotency-Key goes, as a path segment of its own, ${LOOKUP_EXAMPLE}`;
  }
  if (slots > 1) return `must have {key} once (it has it ${slots} times), ${LOOKUP_EXAMPLE}`;
  // Letters and digits: the URL parser leaves them as they are wherever they stand.
  const marker = 'lookupkeymarker0';
  const filled = template.replace('{key}', marker);
  if (!/^https?:\/\//i.test(template) || !URL.canParse(filled)) {
    return `must be an absolute http(s) URL with {key} where the Idempotency-Key goes, ${LOOKUP_EXAMPLE}`;
  }
  const url = new URL(filled);
  if (url.username !== '' || url.password !== '') {
    return (
      'must not carry a user name or password (URLs are shown in messages and logs): sign the lookups with ' +
      'PUBLISH_WEBHOOK_SECRET, or give the receiver a token in the query string (?token=...)'
    );
  }
  if (url.hash !== '') {
    return `must not have a fragment ("${url.hash.replace(marker, '{key}')}"): a fragment is never sent; remove it${
      url.hash.includes(marker) ? ` and put {key} in the path, ${LOOKUP_EXAMPLE}` : ''
    }`;
  }
  if (url.hostname.includes(marker)) return `must have {key} in the path, not in the host, ${LOOKUP_EXAMPLE}`;
  if (url.search.includes(marker)) {
    return (
      `must have {key} in the path, not in the query string, ${LOOKUP_EXAMPLE}; a query string without {key} is ` +
      'fine (e.g. ?token=... for a receiver that wants one) and is sent as it is with every lookup'
    );
  }
  if (!url.pathname.split('/').includes(marker)) {
    return (
      'must have {key} as a whole path segment, between two "/" or at the end of the path, not inside one ' +
      `(key-{key}, {key}.json), ${LOOKUP_EXAMPLE}`
    );
  }
  if (url.pathname.endsWith('/')) {
    return (
      'must not end its path with "/": the receiver would answer its "no such route" 404, which reads as "no ' +
      `such delivery"; remove the trailing "/", ${LOOKUP_EXAMPLE}`
    );
  }
  return undefined;
}

/**
 * Every environment variable the project reads, with its default. docker-compose.yml and the README's
 * configuration table are checked against this list by test/docker-compose.test.ts.
 */
const EnvSchema = z.object({
  TEMPORAL_ADDRESS: optionalText,
  TEMPORAL_NAMESPACE: z.string().trim().min(1).default('default'),
  TEMPORAL_TASK_QUEUE: z.string().trim().min(1).default(DEFAULT_TASK_QUEUE),
  EMBEDDED_TEMPORAL_PORT: positiveInt(DEFAULT_TEMPORAL_PORT),
  TEMPORAL_UI_PORT: positiveInt(DEFAULT_UI_PORT),
  TEMPORAL_CLI_PATH: optionalText,
  TEMPORAL_TEST_SERVER_PATH: optionalText,
  DATA_DIR: optionalText,
  MODEL: optionalText,
  OPENAI_BASE_URL: optionalUrl('put the API key in OPENAI_API_KEY'),
  OPENAI_API_KEY: optionalText,
  OPENAI_MODEL: optionalText,
  ANTHROPIC_BASE_URL: optionalUrl('put the API key in ANTHROPIC_API_KEY'),
  ANTHROPIC_API_KEY: optionalText,
  MODEL_REQUEST_TIMEOUT_MS: positiveInt(90_000),
  OFFLINE_MODEL_LATENCY_MS: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? 0 : Number(s)))
    .pipe(z.number().int().min(0).max(600_000)),
  MODEL_PRICES: z
    .string()
    .trim()
    .optional()
    .transform((s, ctx) => {
      if (s === undefined || s === '') return {};
      try {
        return JSON.parse(s) as unknown;
      } catch {
        ctx.addIssue({
          code: 'custom',
          message: 'must be JSON, e.g. {"my-model": {"inputPerMillion": 1, "outputPerMillion": 2}}',
        });
        return z.NEVER;
      }
    })
    .pipe(PriceTableSchema),
  PUBLISH_WEBHOOK_URL: optionalUrl(
    'let the receiver check PUBLISH_WEBHOOK_SECRET, which signs every request',
  ),
  PUBLISH_WEBHOOK_LOOKUP_URL: optionalText.superRefine((template, ctx) => {
    const problem = template === undefined ? undefined : lookupUrlProblem(template);
    if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
  }),
  PUBLISH_REQUEST_TIMEOUT_MS: positiveInt(15_000),
  MAX_DOCUMENT_BYTES: positiveInt(1_000_000),
  DOCUMENT_EXTENSIONS: DocumentExtensionsSchema,
  PAYLOAD_ENCRYPTION_KEY: optionalText,
  PAYLOAD_ENCRYPTION_KEY_ID: optionalText,
  PAYLOAD_DECRYPTION_KEYS: optionalText,
  PUBLISH_WEBHOOK_SECRET: optionalText.refine((s) => s === undefined || isValidSecret(s), SECRET_FORMAT),
  PUBLISH_TARGET_HOST: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? '127.0.0.1' : s)),
  PAYLOAD_REQUIRE_ENCRYPTION: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? 'false' : s.toLowerCase()))
    .pipe(z.enum(['true', 'false'], { error: 'must be true or false' }))
    .transform((s) => s === 'true'),
  DOCUMENT_ID_SECRET: optionalText,
  DATABASE_URL: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === '' ? undefined : s))
    .pipe(z.url({ protocol: /^postgres(ql)?$/, error: 'must be a postgres:// URL' }).optional()),
  MEMO_LEASE_SECONDS: positiveInt(30),
  MAX_PROVIDER_ERRORS: positiveInt(6),
  MODEL_RPM: optionalPositiveInt,
  MODEL_TPM: optionalPositiveInt,
  MODEL_MAX_CONCURRENT: optionalPositiveInt,
  STEP_BUDGET_MINUTES: positiveInt(60),
  REVIEW: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? 'off' : s.toLowerCase()))
    .pipe(z.enum(['on', 'off'], { error: 'must be on or off' })),
  REVIEW_TIMEOUT_HOURS: positiveInt(72).pipe(
    z.number().max(MAX_REVIEW_MINUTES / 60, `must be at most ${MAX_REVIEW_MINUTES / 60} hours (30 days)`),
  ),
  REVIEW_ON_TIMEOUT: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? 'reject' : s))
    .pipe(z.enum(REVIEW_POLICIES)),
  REVIEWER: optionalText,
  REVIEW_PAGE_TOKEN: optionalText.pipe(
    z
      .string()
      .min(32, 'must be at least 32 characters (a random password: npm run keygen prints one)')
      .optional(),
  ),
  REVIEW_PAGE_ORIGIN: optionalText.pipe(
    z
      .url({ protocol: /^https?$/, error: 'must be an http(s) origin, e.g. https://review.example.com' })
      .refine(
        (u) => new URL(u).origin === u.replace(/\/$/, ''),
        'must be an origin only (no path, query or user)',
      )
      .transform((u) => new URL(u).origin)
      .optional(),
  ),
  AGENT: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? 'off' : s.toLowerCase()))
    .pipe(z.enum(['on', 'off'], { error: 'must be on or off' })),
  AGENT_MAX_TURNS: positiveInt(AGENT_LIMITS.maxTurns.default).pipe(z.number().max(AGENT_LIMITS.maxTurns.max)),
  AGENT_MAX_TOKENS: positiveInt(AGENT_LIMITS.maxTokens.default).pipe(
    z.number().min(AGENT_LIMITS.maxTokens.min).max(AGENT_LIMITS.maxTokens.max),
  ),
  AGENT_MAX_COST_USD: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? undefined : Number(s)))
    .pipe(z.number().positive('must be a positive number of US dollars').finite().optional()),
  AGENT_HISTORY_EVENTS: positiveInt(AGENT_LIMITS.historyEvents.default).pipe(
    z.number().min(AGENT_LIMITS.historyEvents.min).max(AGENT_LIMITS.historyEvents.max),
  ),
  AGENT_TOOL_URL: optionalText.pipe(
    z.url({ protocol: /^https?$/, error: 'must be an http(s) URL' }).optional(),
  ),
  BULK: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? 'off' : s.toLowerCase()))
    .pipe(z.enum(['on', 'off'], { error: 'must be on or off' })),
  BULK_MAX_REQUESTS: positiveInt(50_000).pipe(
    z.number().max(50_000, "must be at most 50000 (OpenAI's limit)"),
  ),
  BULK_ROUNDS: positiveInt(2).pipe(z.number().max(5, 'must be at most 5')),
  BULK_POLL_SECONDS: positiveInt(60).pipe(z.number().max(3600, 'must be at most 3600')),
  BULK_POLL_MAX_SECONDS: positiveInt(1800).pipe(z.number().max(6 * 3600, 'must be at most 21600 (6 hours)')),
  BATCH_WINDOW: positiveInt(16).pipe(z.number().max(1000, 'must be at most 1000 documents at once')),
  OPEN_DELIVERY_POLICY: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? 'auto' : s))
    .pipe(z.enum(['auto', 'resend', 'hold'])),
  LOG_LEVEL: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? 'info' : s.toLowerCase()))
    .pipe(z.enum(LOG_LEVELS, { error: `must be one of ${LOG_LEVELS.join(', ')}` })),
  METRICS_PORT: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? undefined : Number(s)))
    .pipe(z.number().int().min(1).max(65_535).optional()),
  METRICS_HOST: z
    .string()
    .trim()
    .optional()
    .transform((s) => (s === undefined || s === '' ? '127.0.0.1' : s)),
  OTEL_EXPORTER_OTLP_ENDPOINT: optionalUrl(
    'send credentials as headers instead (OTEL_EXPORTER_OTLP_HEADERS, read by the exporter)',
  ),
});

export const CONFIG_VARIABLES = EnvSchema.keyof().options;

/** The documents a fresh clone processes when no paths are given. */
export const SAMPLES_DIR = path.resolve(__dirname, '..', 'samples');

/** The data folder's layout, spelled once: every file the project keeps there. */
export function dataPaths(dataDir: string) {
  return {
    blobs: path.join(dataDir, 'blobs'),
    memo: path.join(dataDir, 'memo.db'),
    ledger: path.join(dataDir, 'ledger.db'),
    publications: path.join(dataDir, 'publications.db'),
    temporal: path.join(dataDir, 'temporal.db'),
    temporalLog: path.join(dataDir, 'temporal-server.log'),
    temporalPid: path.join(dataDir, 'temporal-server.pid'),
    /** The review page's form key: forms stay good across a restart of the page. */
    reviewPageKey: path.join(dataDir, 'review-page.key'),
  };
}
export type DataPaths = ReturnType<typeof dataPaths>;

export interface Config {
  /**
   * Where the Temporal server is, read the standard way (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, an envconfig
   * profile, TLS and API key). An unset address means "embedded dev server unless one answers on 7233".
   */
  temporal: TemporalSettings;
  taskQueue: string;
  /** Port of the embedded dev server (and of the "already running" probe) when no address is configured. */
  embeddedPort: number;
  uiPort: number;
  cliPath: string | undefined;
  testServerPath: string | undefined;
  /** PATH, where the Temporal binaries are looked for when no explicit path is set. */
  searchPath: string;
  dataDir: string;
  /** The files in the data folder. */
  paths: DataPaths;
  /** The offline model, or a provider's model chosen by MODEL (or OPENAI_BASE_URL + OPENAI_MODEL). */
  model: ModelSettings;
  modelRequestTimeoutMs: number;
  /** Artificial latency of the offline model, to watch crashes land inside model calls (demos, chaos tests). */
  offlineModelLatencyMs: number;
  /** Model prices for cost estimates: the defaults, overridden and extended by MODEL_PRICES. */
  prices: PriceTable;
  publisher: { kind: 'sqlite' } | { kind: 'webhook'; url: string };
  publishRequestTimeoutMs: number;
  maxDocumentBytes: number;
  /** The file endings a folder given to the client is searched for (DOCUMENT_EXTENSIONS). */
  documentExtensions: readonly string[];
  /** Where blobs, memo, ledger and publications live: SQLite files in the data folder, or one PostgreSQL. */
  database: { kind: 'sqlite' } | { kind: 'postgres'; url: string };
  /** How long a model step's claim on its memo entry lives without renewal (a stalled owner loses it then). */
  memoLeaseMs: number;
  /** Provider errors (error statuses, timeouts, refused answers) one run's model step may meet before it fails. */
  maxProviderErrors: number;
  /**
   * The provider's limits for the whole fleet (MODEL_RPM, MODEL_TPM, MODEL_MAX_CONCURRENT); unset: learned from
   * the provider's rate-limit headers, and no cap on calls in flight.
   */
  modelLimits: { requestsPerMinute?: number; tokensPerMinute?: number; maxConcurrent?: number };
  /** Default overall budget of each step, all retries included: crashes and stalls retry within it, uncapped. */
  stepBudgetMinutes: number;
  /** Document runs a batch keeps open at once (its sliding window). */
  batchWindow: number;
  /**
   * REVIEW=on: every document's draft waits for a person's review before it is published (npm run review), for
   * REVIEW_TIMEOUT_HOURS (default 72), then ends by REVIEW_ON_TIMEOUT (`reject`, the default, or `publish`).
   */
  review: ReviewSettings | undefined;
  /** REVIEW_TIMEOUT_HOURS and REVIEW_ON_TIMEOUT, REVIEW on or off: the deadline a worker's review gauges compare with. */
  reviewDeadline: ReviewSettings;
  /**
   * AGENT=on: every document's agent steps run (docs/agent.md), within AGENT_MAX_TURNS, AGENT_MAX_TOKENS and
   * AGENT_MAX_COST_USD, continuing as new past AGENT_HISTORY_EVENTS; off (the default) they do not.
   */
  agent: AgentSettings | undefined;
  /** AGENT_TOOL_URL: where an agent's tool that changes something sends it (npm start serves the demo's). */
  agentToolUrl: string | undefined;
  /**
   * BULK=on (or `--bulk`): the batch's model requests go to the provider's batch API first, at half the price
   * (docs/bulk.md), with BULK_MAX_REQUESTS, BULK_ROUNDS, BULK_POLL_SECONDS and BULK_POLL_MAX_SECONDS.
   */
  bulk: BulkSettings;
  bulkOn: boolean;
  /** REVIEWER: the name `npm run review` decides under; REVIEW_PAGE_TOKEN: the review page's password. */
  reviewer: string | undefined;
  reviewPageToken: string | undefined;
  /** REVIEW_PAGE_ORIGIN: the page's public origin behind a reverse proxy (`https://review.example.com`). */
  reviewPageOrigin: string | undefined;
  /**
   * What a webhook delivery does when it finds an earlier attempt's claim open (sent, never answered): `resend`
   * (the receiver dedupes by key), `hold` (wait for an operator's verdict), `auto` (resend once the receiver has
   * echoed a key, hold before).
   */
  openDeliveryPolicy: 'auto' | 'resend' | 'hold';
  /** PUBLISH_WEBHOOK_LOOKUP_URL: the receiver's lookup by key, asked before an open delivery is held or resent. */
  publishLookupUrl: string | undefined;
  /**
   * AES-GCM payload encryption settings; off while `key` is unset. `required`: workers and clients refuse
   * plaintext payloads. Secrets: never log this object.
   */
  payloadEncryption: {
    key: string | undefined;
    /** The ID given in PAYLOAD_ENCRYPTION_KEY_ID; unset: the codec derives one from the key. */
    keyId: string | undefined;
    retired: string | undefined;
    required: boolean;
  };
  /** Shared secret the webhook publisher signs with and the publish target verifies; unset: unsigned. */
  publishSecret: string | undefined;
  /** Address `npm run publish-target` binds to; anything but loopback needs publishSecret. */
  publishTargetHost: string;
  /** When set, document IDs are an HMAC of the path under this secret, so IDs reveal nothing guessable. */
  documentIdSecret: string | undefined;
  /** LOG_LEVEL: the lowest level logged; failures carry their stack traces only at `debug` and `trace`. */
  logLevel: LogLevel;
  /** Where a worker serves Prometheus metrics (the Temporal runtime's and the pipeline's); unset: not served. */
  metrics: { host: string; port: number } | undefined;
  /** OTEL_EXPORTER_OTLP_ENDPOINT as given; what tracing uses, with every other OTEL_* variable, is `tracing`. */
  otlpEndpoint: string | undefined;
  /** Where traces go and how, from the standard OTEL_* variables (src/telemetry/otlp-settings.ts). */
  tracing: TracingSettings;
}

/** Thrown for a configuration a person has to fix; the message says which variable and how. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** Reads and validates the environment once; the project's only reader of process.env. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, cwd = process.cwd()): Config {
  const parsed = EnvSchema.safeParse(env);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
    throw new ConfigError(`Invalid environment: ${problems}`);
  }
  const e = parsed.data;
  const model = chooseModel(e);
  if ('problem' in model) throw new ConfigError(model.problem);
  const tracing = readTracingSettings(env);
  if ('problem' in tracing) throw new ConfigError(tracing.problem);
  const dataDir = path.resolve(cwd, e.DATA_DIR ?? 'data');
  return {
    temporal: readTemporalSettings(env, e.TEMPORAL_NAMESPACE),
    taskQueue: e.TEMPORAL_TASK_QUEUE,
    embeddedPort: e.EMBEDDED_TEMPORAL_PORT,
    uiPort: e.TEMPORAL_UI_PORT,
    cliPath: e.TEMPORAL_CLI_PATH,
    testServerPath: e.TEMPORAL_TEST_SERVER_PATH,
    searchPath: env.PATH ?? '',
    dataDir,
    paths: dataPaths(dataDir),
    model,
    modelRequestTimeoutMs: e.MODEL_REQUEST_TIMEOUT_MS,
    offlineModelLatencyMs: e.OFFLINE_MODEL_LATENCY_MS,
    // No prototype: a model named `constructor` or `toString` finds no price rather than Object.prototype's.
    prices: Object.assign(Object.create(null), DEFAULT_PRICES, e.MODEL_PRICES),
    publisher:
      e.PUBLISH_WEBHOOK_URL !== undefined
        ? { kind: 'webhook', url: e.PUBLISH_WEBHOOK_URL }
        : { kind: 'sqlite' },
    publishRequestTimeoutMs: e.PUBLISH_REQUEST_TIMEOUT_MS,
    maxDocumentBytes: e.MAX_DOCUMENT_BYTES,
    documentExtensions: e.DOCUMENT_EXTENSIONS,
    database: e.DATABASE_URL !== undefined ? { kind: 'postgres', url: e.DATABASE_URL } : { kind: 'sqlite' },
    memoLeaseMs: e.MEMO_LEASE_SECONDS * 1000,
    maxProviderErrors: e.MAX_PROVIDER_ERRORS,
    modelLimits: {
      ...(e.MODEL_RPM === undefined ? {} : { requestsPerMinute: e.MODEL_RPM }),
      ...(e.MODEL_TPM === undefined ? {} : { tokensPerMinute: e.MODEL_TPM }),
      ...(e.MODEL_MAX_CONCURRENT === undefined ? {} : { maxConcurrent: e.MODEL_MAX_CONCURRENT }),
    },
    stepBudgetMinutes: e.STEP_BUDGET_MINUTES,
    batchWindow: e.BATCH_WINDOW,
    bulkOn: e.BULK === 'on',
    bulk: {
      maxRequests: e.BULK_MAX_REQUESTS,
      rounds: e.BULK_ROUNDS,
      pollSeconds: e.BULK_POLL_SECONDS,
      pollMaxSeconds: e.BULK_POLL_MAX_SECONDS,
    },
    reviewer: e.REVIEWER,
    reviewPageToken: e.REVIEW_PAGE_TOKEN,
    reviewPageOrigin: e.REVIEW_PAGE_ORIGIN,
    review:
      e.REVIEW === 'on'
        ? { timeoutMinutes: e.REVIEW_TIMEOUT_HOURS * 60, onTimeout: e.REVIEW_ON_TIMEOUT }
        : undefined,
    reviewDeadline: { timeoutMinutes: e.REVIEW_TIMEOUT_HOURS * 60, onTimeout: e.REVIEW_ON_TIMEOUT },
    agent:
      e.AGENT === 'on'
        ? {
            maxTurns: e.AGENT_MAX_TURNS,
            maxTokens: e.AGENT_MAX_TOKENS,
            historyEvents: e.AGENT_HISTORY_EVENTS,
            ...(e.AGENT_MAX_COST_USD === undefined ? {} : { maxCostUsd: e.AGENT_MAX_COST_USD }),
          }
        : undefined,
    agentToolUrl: e.AGENT_TOOL_URL,
    openDeliveryPolicy: e.OPEN_DELIVERY_POLICY,
    publishLookupUrl: e.PUBLISH_WEBHOOK_LOOKUP_URL,
    payloadEncryption: {
      key: e.PAYLOAD_ENCRYPTION_KEY,
      keyId: e.PAYLOAD_ENCRYPTION_KEY_ID,
      retired: e.PAYLOAD_DECRYPTION_KEYS,
      required: e.PAYLOAD_REQUIRE_ENCRYPTION,
    },
    publishSecret: e.PUBLISH_WEBHOOK_SECRET,
    publishTargetHost: e.PUBLISH_TARGET_HOST,
    documentIdSecret: e.DOCUMENT_ID_SECRET,
    logLevel: e.LOG_LEVEL,
    metrics: e.METRICS_PORT === undefined ? undefined : { host: e.METRICS_HOST, port: e.METRICS_PORT },
    otlpEndpoint: e.OTEL_EXPORTER_OTLP_ENDPOINT,
    tracing,
  };
}
