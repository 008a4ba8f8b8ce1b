/**
 * Static checks of docker-compose.yml and the Dockerfile against the code (there is no Docker engine in CI):
 * ports, service wiring, the worker's environment as loadConfig reads it, the built entry point, pinned images.
 */
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import ts from 'typescript';
import { parse } from 'yaml';
import { DYNAMIC_CONFIG } from '../src/temporal/tuning';
import { SHUTDOWN_GRACE_MS } from '../src/temporal/worker';
import { z } from 'zod';
import { CONFIG_VARIABLES, DEFAULT_TEMPORAL_PORT, DEFAULT_UI_PORT, loadConfig } from '../src/config';
import { DEFAULT_TASK_QUEUE } from '../src/contract';
import { PIPELINE_METRIC_NAMES } from '../src/telemetry/metrics';
import { TESTED_NODE_RELEASES } from '../scripts/node-releases';
import { DASHBOARD_FILE, dashboardQueries } from './dashboard';

const ROOT = path.resolve(__dirname, '..');
const COMPOSE_FILE = path.join(ROOT, 'docker-compose.yml');

/** The Temporal frontend's gRPC port inside its container, and the UI image's default listening port. */
const TEMPORAL_FRONTEND_PORT = 7233;
const UI_IMAGE_DEFAULT_PORT = 8080;

// ---------------------------------------------------------------------------------------------------------
// Compose file schema: only the parts the checks read; unknown keys are ignored.

const Scalar = z.union([z.string(), z.number(), z.boolean()]);

const EnvironmentSchema = z.union([z.record(z.string(), Scalar.nullable()), z.array(z.string())]);

const PortSchema = z.union([
  z.string(),
  z.number(),
  z.object({
    target: z.coerce.number(),
    published: z.coerce.number().optional(),
    host_ip: z.string().optional(),
    protocol: z.string().optional(),
  }),
]);

const VolumeMountSchema = z.union([
  z.string(),
  z.object({ type: z.string(), source: z.string().optional(), target: z.string() }),
]);

const ServiceSchema = z.object({
  image: z.string().optional(),
  build: z
    .union([z.string(), z.object({ context: z.string().default('.'), dockerfile: z.string().optional() })])
    .optional(),
  container_name: z.string().optional(),
  environment: EnvironmentSchema.optional(),
  ports: z.array(PortSchema).optional(),
  expose: z.array(Scalar).optional(),
  volumes: z.array(VolumeMountSchema).optional(),
  depends_on: z
    .union([z.array(z.string()), z.record(z.string(), z.object({ condition: z.string().optional() }))])
    .optional(),
  healthcheck: z.object({ test: z.union([z.string(), z.array(z.string())]) }).optional(),
  networks: z.union([z.array(z.string()), z.record(z.string(), z.unknown())]).optional(),
  stop_grace_period: z.string().optional(),
  command: z.union([z.string(), z.array(z.string())]).optional(),
});
type Service = z.infer<typeof ServiceSchema>;

const ComposeSchema = z.object({
  services: z.record(z.string(), ServiceSchema),
  networks: z.record(z.string(), z.unknown()).optional(),
  volumes: z.record(z.string(), z.unknown()).optional(),
});
type Compose = z.infer<typeof ComposeSchema>;

function loadCompose(): Compose {
  const doc: unknown = parse(fs.readFileSync(COMPOSE_FILE, 'utf8'));
  return ComposeSchema.parse(doc);
}

function service(compose: Compose, name: string): Service {
  const s = compose.services[name];
  assert.ok(s, `docker-compose.yml has no service "${name}"`);
  return s;
}

/** The environment as written in the file; undefined is a bare `KEY` / `KEY:` (passed through from the host). */
function rawEnvironment(s: Service): Map<string, string | undefined> {
  const env = new Map<string, string | undefined>();
  const e = s.environment;
  if (e === undefined) return env;
  if (Array.isArray(e)) {
    for (const entry of e) {
      const eq = entry.indexOf('=');
      if (eq === -1) env.set(entry, undefined);
      else env.set(entry.slice(0, eq), entry.slice(eq + 1));
    }
  } else {
    for (const [k, v] of Object.entries(e)) env.set(k, v === null ? undefined : String(v));
  }
  return env;
}

/** Compose's variable interpolation: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}. */
function interpolate(value: string, host: Record<string, string | undefined>): string {
  const pattern = /\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))/g;
  return value.replace(
    pattern,
    (_m, dollar?: string, braced?: string, op?: string, arg?: string, bare?: string): string => {
      if (dollar !== undefined) return '$';
      const name = braced ?? bare ?? '';
      const v = host[name];
      const missing = op?.startsWith(':') ? v === undefined || v === '' : v === undefined;
      if (!missing) return v ?? '';
      if (op === ':?' || op === '?') throw new Error(`required variable ${name} is not set: ${arg ?? ''}`);
      return arg ?? '';
    },
  );
}

/** The environment a container would get, given the host's environment (which compose interpolates from). */
function containerEnvironment(s: Service, host: Record<string, string | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of rawEnvironment(s)) {
    if (v === undefined) {
      const passed = host[k];
      if (passed !== undefined) out[k] = passed;
    } else {
      out[k] = interpolate(v, host);
    }
  }
  return out;
}

interface PortMapping {
  published: number | undefined;
  target: number;
  /** The host address it is published on; undefined means every interface. */
  hostIp: string | undefined;
}

function portMappings(s: Service): PortMapping[] {
  return (s.ports ?? []).map((p) => {
    if (typeof p === 'number') return { published: undefined, target: p, hostIp: undefined };
    if (typeof p === 'object') return { published: p.published, target: p.target, hostIp: p.host_ip };
    // [HOST_IP:][HOST_PORT:]CONTAINER_PORT[/PROTOCOL]
    const parts = p.split('/')[0]?.split(':') ?? [];
    const target = Number(parts.at(-1));
    const published = parts.length >= 2 ? Number(parts.at(-2)) : undefined;
    return { published, target, hostIp: parts.length === 3 ? parts[0] : undefined };
  });
}

function networksOf(s: Service): string[] {
  if (s.networks === undefined) return ['default'];
  return Array.isArray(s.networks) ? s.networks : Object.keys(s.networks);
}

function dependsOn(s: Service): Map<string, string> {
  const deps = new Map<string, string>();
  if (Array.isArray(s.depends_on)) for (const d of s.depends_on) deps.set(d, 'service_started');
  else for (const [d, v] of Object.entries(s.depends_on ?? {})) deps.set(d, v.condition ?? 'service_started');
  return deps;
}

function bindMounts(s: Service): { source: string; target: string }[] {
  return (s.volumes ?? []).flatMap((v) => {
    if (typeof v === 'object') return v.source === undefined ? [] : [{ source: v.source, target: v.target }];
    const [source, target] = v.split(':');
    return source !== undefined && target !== undefined ? [{ source, target }] : [];
  });
}

/** `host:port` → its parts; fails the test on anything else. */
function splitAddress(address: string | undefined): { host: string; port: number } {
  const m = /^([A-Za-z0-9._-]+):(\d+)$/.exec(address ?? '');
  assert.ok(m?.[1] !== undefined && m[2] !== undefined, `"${address ?? ''}" is not of the form host:port`);
  return { host: m[1], port: Number(m[2]) };
}

/** Splits an image reference into name and tag; a digest-pinned reference counts as pinned. */
function imageTag(ref: string): { name: string; tag: string | undefined; digest: boolean } {
  const [nameAndTag = '', digest] = ref.split('@');
  const slash = nameAndTag.lastIndexOf('/');
  const colon = nameAndTag.lastIndexOf(':');
  if (colon > slash)
    return { name: nameAndTag.slice(0, colon), tag: nameAndTag.slice(colon + 1), digest: !!digest };
  return { name: nameAndTag, tag: undefined, digest: !!digest };
}

// ---------------------------------------------------------------------------------------------------------
// Dockerfile: instructions grouped by stage (line continuations joined, comments dropped).

interface Stage {
  from: string;
  alias: string | undefined;
  instructions: { op: string; args: string }[];
}

function parseDockerfile(file: string): Stage[] {
  const lines = fs.readFileSync(file, 'utf8').split(/\r?\n/);
  const logical: string[] = [];
  let current = '';
  for (const line of lines) {
    if (current === '' && /^\s*#/.test(line)) continue;
    const continued = /\\\s*$/.test(line);
    current += (current === '' ? '' : ' ') + line.replace(/\\\s*$/, '').trim();
    if (!continued) {
      if (current.trim() !== '') logical.push(current.trim());
      current = '';
    }
  }
  if (current.trim() !== '') logical.push(current.trim());

  const stages: Stage[] = [];
  for (const l of logical) {
    const m = /^(\S+)\s*(.*)$/.exec(l);
    const op = m?.[1]?.toUpperCase() ?? '';
    const args = m?.[2] ?? '';
    if (op === 'FROM') {
      const from = /^(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?/i.exec(args);
      stages.push({ from: from?.[1] ?? '', alias: from?.[2], instructions: [] });
    } else {
      stages.at(-1)?.instructions.push({ op, args });
    }
  }
  return stages;
}

/** The value the last instruction `op` in a stage sets (WORKDIR, USER, CMD...). */
function lastArg(stage: Stage, op: string): string | undefined {
  return stage.instructions.filter((i) => i.op === op).at(-1)?.args;
}

/** Where `tsc -p tsconfig.json` writes the JavaScript for a source file, relative to the project root. */
function compiledPath(sourceFile: string): { js: string; outDir: string } {
  const configFile = path.join(ROOT, 'tsconfig.json');
  const read = ts.readConfigFile(configFile, (p) => ts.sys.readFile(p));
  assert.equal(read.error, undefined, 'tsconfig.json does not parse');
  const parsed = ts.parseJsonConfigFileContent(read.config, ts.sys, ROOT, undefined, configFile);
  const outDir = parsed.options.outDir;
  assert.ok(outDir !== undefined, 'tsconfig.json sets no outDir');
  const input = path.join(ROOT, sourceFile).split(path.sep).join('/');
  assert.ok(parsed.fileNames.includes(input), `tsconfig.json does not compile ${sourceFile}`);
  const js = ts.getOutputFileNames(parsed, input, false).find((f) => f.endsWith('.js'));
  assert.ok(js !== undefined, `tsc would emit no JavaScript for ${sourceFile}`);
  const rel = (p: string) => path.relative(ROOT, p).split(path.sep).join('/');
  return { js: rel(js), outDir: rel(outDir) };
}

// ---------------------------------------------------------------------------------------------------------

describe('docker-compose.yml', () => {
  it('parses and has the six services', () => {
    const compose = loadCompose();
    for (const name of [
      'postgresql',
      'pipeline-db',
      'temporal',
      'temporal-admin-tools',
      'temporal-ui',
      'worker',
    ]) {
      service(compose, name);
    }
  });

  it('gives the worker longer to stop than its shutdown grace, so a deploy lets steps in flight finish', () => {
    const grace = service(loadCompose(), 'worker').stop_grace_period;
    const seconds = /^(\d+)s$/.exec(grace ?? '')?.[1];
    assert.ok(seconds !== undefined, `the worker's stop_grace_period should read like "30s", not ${grace}`);
    assert.ok(
      Number(seconds) * 1000 >= SHUTDOWN_GRACE_MS + 5_000,
      `stop_grace_period ${grace} leaves no room after the worker's ${SHUTDOWN_GRACE_MS} ms shutdown grace`,
    );
  });

  it('publishes the same host ports as the embedded dev server', () => {
    const compose = loadCompose();
    const grpc = portMappings(service(compose, 'temporal')).find(
      (p) => p.published === DEFAULT_TEMPORAL_PORT,
    );
    assert.ok(grpc, `temporal does not publish host port ${String(DEFAULT_TEMPORAL_PORT)}`);
    assert.equal(grpc.target, TEMPORAL_FRONTEND_PORT);

    const uiService = service(compose, 'temporal-ui');
    const uiPort = Number(rawEnvironment(uiService).get('TEMPORAL_UI_PORT') ?? UI_IMAGE_DEFAULT_PORT);
    const ui = portMappings(uiService).find((p) => p.published === DEFAULT_UI_PORT);
    assert.ok(ui, `temporal-ui does not publish host port ${String(DEFAULT_UI_PORT)}`);
    assert.equal(ui.target, uiPort, 'temporal-ui maps the host port to a port the UI does not listen on');
  });

  it('sets only environment variables the code reads on the worker', () => {
    const known = new Set<string>(CONFIG_VARIABLES);
    const unknown = [...rawEnvironment(service(loadCompose(), 'worker')).keys()].filter((k) => !known.has(k));
    assert.deepEqual(unknown, [], `worker sets variables src/config.ts never reads: ${unknown.join(', ')}`);
  });

  it('hands the worker every setting it reads, except the ones that only make sense on the host', () => {
    // Read by clients or by the embedded dev server on the host, or by tests; not by a worker in a container.
    const hostOnly = new Set([
      'EMBEDDED_TEMPORAL_PORT',
      'TEMPORAL_UI_PORT',
      'TEMPORAL_CLI_PATH',
      'TEMPORAL_TEST_SERVER_PATH',
      'OFFLINE_MODEL_LATENCY_MS',
      // The client's default budget for the runs it submits.
      'STEP_BUDGET_MINUTES',
      // Set by the Dockerfile; with DATABASE_URL nothing is kept there.
      'DATA_DIR',
      // Read by npm run publish-target and by the submitting client.
      'PUBLISH_TARGET_HOST',
      'DOCUMENT_ID_SECRET',
      // The endings the submitting client searches folders for.
      'DOCUMENT_EXTENSIONS',
      // A review is asked for by the submitting client; npm run review and its page run where the reviewer is.
      'REVIEW',
      'REVIEW_TIMEOUT_HOURS',
      'REVIEW_ON_TIMEOUT',
      'REVIEWER',
      'REVIEW_PAGE_TOKEN',
      'REVIEW_PAGE_ORIGIN',
      // Bulk mode is asked for by the submitting client, with its settings, in the batch's input.
      'BULK',
      'BULK_MAX_REQUESTS',
      'BULK_ROUNDS',
      'BULK_POLL_SECONDS',
      'BULK_POLL_MAX_SECONDS',
      // Agent steps are turned on, with their limits, by the submitting client in the runs' input.
      'AGENT',
      'AGENT_MAX_TURNS',
      'AGENT_MAX_TOKENS',
      'AGENT_MAX_COST_USD',
      'AGENT_HISTORY_EVENTS',
    ]);
    const given = new Set(rawEnvironment(service(loadCompose(), 'worker')).keys());
    const missing = CONFIG_VARIABLES.filter((v) => !hostOnly.has(v) && !given.has(v));
    assert.deepEqual(missing, [], 'the compose worker would silently run without these settings');
  });

  it('documents every setting in the configuration table of docs/configuration.md', () => {
    const readme = fs.readFileSync(path.join(ROOT, 'docs', 'configuration.md'), 'utf8');
    const undocumented = CONFIG_VARIABLES.filter((v) => !readme.includes(`| \`${v}\``));
    assert.deepEqual(undocumented, []);
  });

  it('points the worker, the UI and the admin tools at the temporal service', () => {
    const compose = loadCompose();
    const temporal = service(compose, 'temporal');
    const grpc = portMappings(temporal).find((p) => p.published === DEFAULT_TEMPORAL_PORT);
    for (const name of ['worker', 'temporal-ui', 'temporal-admin-tools']) {
      const s = service(compose, name);
      const { host, port } = splitAddress(rawEnvironment(s).get('TEMPORAL_ADDRESS'));
      assert.equal(host, 'temporal', `${name}'s TEMPORAL_ADDRESS does not name the temporal service`);
      assert.equal(
        port,
        grpc?.target ?? TEMPORAL_FRONTEND_PORT,
        `${name}'s TEMPORAL_ADDRESS has the wrong port`,
      );
      const shared = networksOf(s).filter((n) => networksOf(temporal).includes(n));
      assert.notDeepEqual(shared, [], `${name} shares no network with temporal`);
      assert.ok(dependsOn(s).has('temporal'), `${name} does not depend on temporal`);
    }
  });

  it('declares every network the services join', () => {
    const compose = loadCompose();
    const declared = new Set(['default', ...Object.keys(compose.networks ?? {})]);
    for (const [name, s] of Object.entries(compose.services)) {
      for (const n of networksOf(s)) assert.ok(declared.has(n), `${name} joins undeclared network ${n}`);
    }
  });

  it("gives the worker the code's default task queue", () => {
    const env = rawEnvironment(service(loadCompose(), 'worker'));
    assert.equal(env.get('TEMPORAL_TASK_QUEUE'), DEFAULT_TASK_QUEUE);
  });

  it('leaves the passed-through worker variables optional', () => {
    for (const [k, v] of rawEnvironment(service(loadCompose(), 'worker'))) {
      for (const ref of (v ?? '').matchAll(/\$\{([^}]*)\}/g)) {
        assert.match(ref[1] ?? '', /^[A-Za-z_][A-Za-z0-9_]*:-/, `${k}: ${ref[0]} has no default`);
      }
    }
  });

  it('gives the worker an environment loadConfig accepts, with nothing set on the host', () => {
    const compose = loadCompose();
    const worker = service(compose, 'worker');
    const runtime = parseDockerfile(path.join(ROOT, 'Dockerfile')).at(-1);
    const workdir = runtime !== undefined ? (lastArg(runtime, 'WORKDIR') ?? '/') : '/';

    const config = loadConfig(containerEnvironment(worker, {}), workdir);
    assert.equal(config.temporal.address, 'temporal:7233');
    assert.equal(config.temporal.namespace, 'default');
    assert.equal(config.taskQueue, DEFAULT_TASK_QUEUE);
    assert.deepEqual(config.model, { kind: 'offline' });
    assert.deepEqual(config.publisher, { kind: 'sqlite' });
  });

  it("keeps the worker's state in the compose PostgreSQL, not in a folder shared with the host", () => {
    const compose = loadCompose();
    const worker = service(compose, 'worker');
    const config = loadConfig(containerEnvironment(worker, {}), '/app');
    assert.equal(config.database.kind, 'postgres');
    const url = new URL(config.database.kind === 'postgres' ? config.database.url : '');
    assert.equal(url.hostname, 'postgresql', 'the worker does not use the compose postgresql service');
    const pgEnv = rawEnvironment(service(compose, 'postgresql'));
    assert.equal(decodeURIComponent(url.username), pgEnv.get('POSTGRES_USER'));
    assert.equal(decodeURIComponent(url.password), pgEnv.get('POSTGRES_PASSWORD'));
    // Its database is made by the one-shot pipeline-db service, which the worker waits for.
    const database = url.pathname.slice(1);
    const setup = JSON.stringify(service(compose, 'pipeline-db').command ?? '');
    assert.ok(setup.includes(`CREATE DATABASE ${database}`), `pipeline-db does not create ${database}`);
    assert.equal(dependsOn(worker).get('pipeline-db'), 'service_completed_successfully');
    assert.deepEqual(bindMounts(worker), [], 'the worker mounts a host folder');
    // The host client reaches the same database on the published port the header comment gives.
    const published = portMappings(service(compose, 'postgresql')).find((p) => p.target === 5432);
    assert.ok(published, 'postgresql is not published on the host, so clients cannot store document texts');
    const header = fs.readFileSync(path.join(ROOT, 'docker-compose.yml'), 'utf8');
    assert.ok(
      header.includes(
        `DATABASE_URL=postgres://${url.username}:${url.password}@localhost:${published.published}/${database}`,
      ),
      'the header comment gives the host client another DATABASE_URL',
    );
  });

  it("passes the host's model and webhook settings through to the worker", () => {
    const host = {
      OPENAI_BASE_URL: 'http://host.docker.internal:11434/v1',
      OPENAI_API_KEY: 'sk-test',
      OPENAI_MODEL: 'llama3.2',
      PUBLISH_WEBHOOK_URL: 'https://example.test/hook',
    };
    const config = loadConfig(containerEnvironment(service(loadCompose(), 'worker'), host), '/app');
    assert.deepEqual(config.model, {
      kind: 'remote',
      provider: 'openai-compatible',
      baseUrl: host.OPENAI_BASE_URL,
      apiKey: host.OPENAI_API_KEY,
      model: host.OPENAI_MODEL,
      variables: { model: 'OPENAI_MODEL', baseUrl: 'OPENAI_BASE_URL', apiKey: 'OPENAI_API_KEY' },
    });
    assert.deepEqual(config.publisher, { kind: 'webhook', url: host.PUBLISH_WEBHOOK_URL });
  });

  it('publishes ports on 127.0.0.1 only: the frontend, the UI and PostgreSQL ask for no password here', () => {
    const compose = loadCompose();
    const open = Object.entries(compose.services ?? {}).flatMap(([name, s]) =>
      portMappings(s)
        .filter((p) => p.published !== undefined && p.hostIp !== '127.0.0.1')
        .map((p) => `${name} ${String(p.published)}`),
    );
    assert.deepEqual(open, [], 'published on every interface');
  });

  it('lets the worker scale (no fixed container name, no host port)', () => {
    const worker = service(loadCompose(), 'worker');
    assert.equal(worker.container_name, undefined);
    assert.deepEqual(portMappings(worker), []);
  });

  it("points temporal's database settings at the postgresql service", () => {
    const compose = loadCompose();
    const temporal = rawEnvironment(service(compose, 'temporal'));
    const pg = service(compose, 'postgresql');
    const pgEnv = rawEnvironment(pg);

    assert.match(temporal.get('DB') ?? '', /^postgres12(_pgx)?$/);
    const seeds = temporal.get('POSTGRES_SEEDS') ?? '';
    assert.equal(seeds, 'postgresql');
    assert.match(imageTag(service(compose, seeds).image ?? '').name, /(^|\/)postgres$/);
    assert.equal(temporal.get('DB_PORT'), pgEnv.get('PGPORT') ?? '5432');
    assert.ok(pgEnv.get('POSTGRES_USER'), 'postgresql sets no POSTGRES_USER');
    assert.equal(temporal.get('POSTGRES_USER'), pgEnv.get('POSTGRES_USER'));
    assert.ok(pgEnv.get('POSTGRES_PASSWORD'), 'postgresql sets no POSTGRES_PASSWORD');
    assert.equal(temporal.get('POSTGRES_PWD'), pgEnv.get('POSTGRES_PASSWORD'));

    assert.equal(dependsOn(service(compose, 'temporal')).get('postgresql'), 'service_healthy');
    assert.ok(pg.healthcheck, 'postgresql has no healthcheck, so service_healthy never happens');
    const dataVolume = (pg.volumes ?? []).find(
      (v) => typeof v === 'string' && v.endsWith(':/var/lib/postgresql/data'),
    );
    const volumeName = typeof dataVolume === 'string' ? dataVolume.split(':')[0] : undefined;
    assert.ok(
      volumeName !== undefined && volumeName in (compose.volumes ?? {}),
      'postgres data is not a named volume',
    );
  });

  it('gives the Temporal server the dynamic config every dev server of the project gets', () => {
    const temporal = service(loadCompose(), 'temporal');
    const file = rawEnvironment(temporal).get('DYNAMIC_CONFIG_FILE_PATH');
    assert.ok(file !== undefined, 'temporal sets no DYNAMIC_CONFIG_FILE_PATH');
    const mount = (temporal.volumes ?? []).find((v) => typeof v === 'string' && v.split(':')[1] === file);
    assert.ok(typeof mount === 'string', `nothing is mounted at ${file}`);
    const dynamic = z
      .record(z.string(), z.array(z.object({ value: z.unknown() })).length(1))
      .parse(parse(fs.readFileSync(path.join(ROOT, mount.split(':')[0] ?? ''), 'utf8')));
    assert.deepEqual(
      Object.fromEntries(Object.entries(dynamic).map(([key, [setting]]) => [key, setting?.value])),
      DYNAMIC_CONFIG,
    );
  });

  it('pins every image to a tag', () => {
    const compose = loadCompose();
    const refs: string[] = [];
    for (const [name, s] of Object.entries(compose.services)) {
      if (s.image === undefined) assert.ok(s.build !== undefined, `${name} has neither image nor build`);
      else refs.push(s.image);
    }
    const stages = parseDockerfile(path.join(ROOT, 'Dockerfile'));
    const aliases = new Set(stages.map((s) => s.alias?.toLowerCase()));
    refs.push(...stages.map((s) => s.from).filter((f) => !aliases.has(f.toLowerCase())));

    for (const ref of refs) {
      const { tag, digest } = imageTag(ref);
      assert.ok(digest || (tag !== undefined && tag !== '' && tag !== 'latest'), `${ref} is not pinned`);
    }
    assert.match(service(compose, 'temporal').image ?? '', /^temporalio\/auto-setup:1\.2\d\.\d+/);
  });
});

describe('docker-compose.yml: observability', () => {
  /** The host file a service mounts at `target` (or a folder above it), resolved against the compose file. */
  function mountedFile(s: Service, target: string): string {
    const mount = bindMounts(s).find((m) => target === m.target || target.startsWith(`${m.target}/`));
    assert.ok(mount, `nothing is mounted at ${target}`);
    const file = path.join(path.resolve(ROOT, mount.source), path.posix.relative(mount.target, target));
    assert.ok(fs.existsSync(file), `${file} is mounted at ${target} but does not exist`);
    return file;
  }

  const workerConfig = () => loadConfig(containerEnvironment(service(loadCompose(), 'worker'), {}), '/app');

  it('runs Prometheus, Grafana and Jaeger with their pages on 127.0.0.1', () => {
    const compose = loadCompose();
    for (const [name, port] of [
      ['prometheus', 9090],
      ['grafana', 3000],
      ['jaeger', 16686],
    ] as const) {
      const page = portMappings(service(compose, name)).find((p) => p.target === port);
      assert.ok(page, `${name} does not publish its page (${port})`);
      assert.equal(page.hostIp, '127.0.0.1');
      assert.ok(
        networksOf(service(compose, name)).includes('pipeline'),
        `${name} is not on the pipeline network`,
      );
    }
  });

  it("has Prometheus scrape every worker replica on the port the worker's metrics page listens on", () => {
    const compose = loadCompose();
    const config = workerConfig();
    assert.ok(config.metrics, 'the compose worker serves no metrics page (METRICS_PORT)');
    assert.equal(
      config.metrics.host,
      '0.0.0.0',
      'the metrics page is unreachable from the prometheus service',
    );
    const file = mountedFile(service(compose, 'prometheus'), '/etc/prometheus/prometheus.yml');
    const Scrape = z.object({
      scrape_configs: z.array(
        z.object({
          job_name: z.string(),
          dns_sd_configs: z.array(z.object({ names: z.array(z.string()), port: z.number() })).optional(),
          static_configs: z.array(z.object({ targets: z.array(z.string()) })).optional(),
        }),
      ),
    });
    const targets = Scrape.parse(parse(fs.readFileSync(file, 'utf8'))).scrape_configs.flatMap((job) => [
      ...(job.dns_sd_configs ?? []).flatMap((d) => d.names.map((n) => `${n}:${d.port}`)),
      ...(job.static_configs ?? []).flatMap((c) => c.targets),
    ]);
    assert.ok(
      targets.includes(`worker:${config.metrics.port}`),
      `prometheus scrapes ${targets.join(', ')}, not worker:${config.metrics.port}`,
    );
  });

  it("sends the worker's traces to Jaeger's OTLP/HTTP port unless the host names a collector", () => {
    const endpoint = new URL(workerConfig().otlpEndpoint ?? 'http://none');
    assert.equal(endpoint.hostname, 'jaeger');
    assert.equal(endpoint.port, '4318');
    const host = { OTEL_EXPORTER_OTLP_ENDPOINT: 'https://otel.example.test' };
    const config = loadConfig(containerEnvironment(service(loadCompose(), 'worker'), host), '/app');
    assert.equal(config.otlpEndpoint, host.OTEL_EXPORTER_OTLP_ENDPOINT);
  });

  it('provisions Grafana with Prometheus and the dashboard, which queries every pipeline metric and no other', () => {
    const grafana = service(loadCompose(), 'grafana');
    const provisioning = mountedFile(grafana, '/etc/grafana/provisioning');
    const Datasources = z.object({ datasources: z.array(z.object({ type: z.string(), url: z.string() })) });
    const sources = Datasources.parse(
      parse(fs.readFileSync(path.join(provisioning, 'datasources', 'datasources.yml'), 'utf8')),
    ).datasources;
    const prometheus = sources.find((d) => d.type === 'prometheus');
    assert.equal(prometheus?.url, 'http://prometheus:9090');
    const Providers = z.object({ providers: z.array(z.object({ options: z.object({ path: z.string() }) })) });
    const [provider] = Providers.parse(
      parse(fs.readFileSync(path.join(provisioning, 'dashboards', 'dashboards.yml'), 'utf8')),
    ).providers;
    assert.ok(provider, 'no dashboard provider');
    const dashboards = mountedFile(grafana, provider.options.path);
    assert.equal(path.join(dashboards, path.basename(DASHBOARD_FILE)), DASHBOARD_FILE);

    const { metricNames } = dashboardQueries();
    const registered = new Set<string>(PIPELINE_METRIC_NAMES);
    const pipeline = [...metricNames].filter((n) => n.startsWith('pipeline_'));
    assert.deepEqual(
      pipeline.filter((n) => !registered.has(n)),
      [],
      'the dashboard queries pipeline metrics the code does not register',
    );
    assert.deepEqual(
      PIPELINE_METRIC_NAMES.filter((n) => !metricNames.has(n)),
      [],
      'the dashboard leaves pipeline metrics out',
    );
  });
});

describe('Dockerfile', () => {
  const file = path.join(ROOT, 'Dockerfile');

  it('is the one the worker service builds', () => {
    const build = service(loadCompose(), 'worker').build;
    assert.ok(build !== undefined, 'worker has no build section');
    const context = typeof build === 'string' ? build : build.context;
    const dockerfile = typeof build === 'string' ? 'Dockerfile' : (build.dockerfile ?? 'Dockerfile');
    assert.equal(path.resolve(ROOT, context, dockerfile), file);
  });

  it('runs the file tsc emits for src/cli/worker.ts, as a non-root user', () => {
    const runtime = parseDockerfile(file).at(-1);
    assert.ok(runtime, 'Dockerfile has no stage');
    const cmd = z
      .array(z.string())
      .min(2)
      .parse(JSON.parse(lastArg(runtime, 'CMD') ?? 'null'));
    const workdir = lastArg(runtime, 'WORKDIR') ?? '/';
    const { js, outDir } = compiledPath('src/cli/worker.ts');

    assert.equal(cmd[0], 'node');
    assert.equal(path.posix.resolve(workdir, cmd[1] ?? ''), path.posix.join(workdir, js));
    assert.equal(lastArg(runtime, 'USER'), 'node');

    // The compiled output reaches the runtime stage from a build stage.
    const copiesOutDir = runtime.instructions.some(
      (i) =>
        i.op === 'COPY' &&
        /--from=/.test(i.args) &&
        path.posix.resolve(workdir, i.args.split(/\s+/).at(-1) ?? '') === path.posix.join(workdir, outDir),
    );
    assert.ok(copiesOutDir, `the runtime stage does not copy ${outDir}/ from a build stage`);
    const installsProdDeps = parseDockerfile(file).some((s) =>
      s.instructions.some((i) => i.op === 'RUN' && /npm ci\b.*--omit=dev/.test(i.args)),
    );
    assert.ok(installsProdDeps, 'no stage installs production dependencies with npm ci --omit=dev');
  });

  it('builds and runs on one Node line, one that npm run test:node tests and engines admits', () => {
    const stages = parseDockerfile(file);
    const aliases = new Set(stages.map((s) => s.alias?.toLowerCase()));
    const majors = new Set(
      stages
        .map((s) => s.from)
        .filter((from) => !aliases.has(from.toLowerCase()))
        .map((ref) => {
          const { name, tag } = imageTag(ref);
          assert.match(name, /(^|\/)node$/, `${ref} is not a Node image`);
          return /^(\d+)\b/.exec(tag ?? '')?.[1];
        }),
    );
    const [major, ...others] = majors;
    assert.equal(others.length, 0, `the stages build on different Node lines: ${[...majors].join(', ')}`);
    assert.ok(major !== undefined && major in TESTED_NODE_RELEASES, `node:${major} is not a tested line`);

    const { engines } = z
      .object({ engines: z.object({ node: z.string() }) })
      .parse(JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')));
    const admitted = engines.node.split('||').map((range) => /^\^(\d+)\b/.exec(range.trim())?.[1]);
    for (const line of Object.keys(TESTED_NODE_RELEASES)) {
      assert.ok(admitted.includes(line), `engines.node (${engines.node}) leaves out the tested Node ${line}`);
    }
  });
});
