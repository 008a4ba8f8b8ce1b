/**
 * OpenTelemetry tracing: one document is one trace. The client's start span travels in the workflow's headers, the
 * workflow's spans (run, and one per scheduled step) are made in the sandbox and handed out through a sink, each
 * step's activity span continues from the headers Temporal gives it, and the model and publish calls are spans
 * inside those (src/telemetry/spans.ts). A batch's documents each get a trace of their own, linked to the batch's
 * (src/telemetry/workflow-tracing.ts), and the reads a client makes while it waits (queries, describes) are not
 * traced. All of that is the SDK's interceptors; this module starts a tracer provider and wires them in.
 *
 * Spans leave over OTLP/HTTP, protobuf by default, as the standard OTEL_* variables say
 * (src/telemetry/otlp-settings.ts); with none set, no provider is started and nothing is traced. Telemetry never
 * decides a run: a collector that refuses, fails or stalls costs one log line (and one more once it answers again),
 * the spans meanwhile, and at most SHUTDOWN_EXPORT_MS (and a second's grace) at exit.
 */
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { ExportResultCode, W3CTraceContextPropagator } from '@opentelemetry/core';
import type { ExportResult } from '@opentelemetry/core';
import { OTLPTraceExporter as JsonTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtobufTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { Resource } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { ReadableSpan, SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace-base';
import {
  makeWorkflowExporter,
  OpenTelemetryActivityInboundInterceptor,
  OpenTelemetryActivityOutboundInterceptor,
  OpenTelemetryWorkflowClientInterceptor,
} from '@temporalio/interceptors-opentelemetry';
import type {
  DescribeWorkflowExecutionResponse,
  Next,
  WorkflowClientInterceptor,
  WorkflowDescribeInput,
  WorkflowQueryInput,
} from '@temporalio/client';
import type { OpenTelemetrySinks } from '@temporalio/interceptors-opentelemetry';
import type { ActivityInterceptorsFactory, InjectedSinks } from '@temporalio/worker';
import type { Config } from '../config';
import { logger } from './log';
import type { Logger } from './log';
import { DEFAULT_SERVICE_NAME } from './otlp-settings';
import type { OtlpTarget } from './otlp-settings';

/** `service.name` of every span the pipeline exports, unless OTEL_SERVICE_NAME says otherwise. */
export const SERVICE_NAME = DEFAULT_SERVICE_NAME;

/** How long a process at its end waits for its last spans to be exported before it goes without them. */
export const SHUTDOWN_EXPORT_MS = 3_000;

/**
 * The workflow-side interceptors, as a module the bundler adds to the workflow code. A prebuilt bundle gets them
 * only if it was built with them: `bundleWorkflowCode({ workflowInterceptorModules: [WORKFLOW_TRACING_MODULE] })`.
 */
export const WORKFLOW_TRACING_MODULE = require.resolve('./workflow-tracing');

export interface Tracing {
  /** Receives every finished span: the Node side's from the provider, the workflow's through the sink. */
  processor: SpanProcessor;
  resource: Resource;
  /** Exports what is buffered and stops; never throws, and gives up after SHUTDOWN_EXPORT_MS. */
  shutdown(): Promise<void>;
}

let active: Tracing | undefined;

export interface TracingOptions {
  /** The resource's attributes; `service.name` is SERVICE_NAME unless they name one. */
  resource?: Record<string, string>;
  /** How long shutdown waits for the processor to flush. */
  shutdownMs?: number;
  /** Told when shutdown gave up waiting. */
  onShutdownTimeout?: () => void;
}

/**
 * Starts this process's tracer provider over `processor` and registers it globally, with W3C trace-context
 * propagation and async-local context (so a span started in an activity is a child of the activity's span).
 */
export function startTracing(
  processor: SpanProcessor,
  { resource: attributes = {}, shutdownMs = SHUTDOWN_EXPORT_MS, onShutdownTimeout }: TracingOptions = {},
): Tracing {
  if (active !== undefined) throw new Error('tracing is already started in this process');
  const resource = new Resource({ 'service.name': SERVICE_NAME, ...attributes });
  const provider = new BasicTracerProvider({ resource, spanProcessors: [processor] });
  provider.register({
    contextManager: new AsyncLocalStorageContextManager().enable(),
    propagator: new W3CTraceContextPropagator(),
  });
  const tracing: Tracing = {
    processor,
    resource,
    shutdown: async () => {
      if (active === tracing) active = undefined;
      let timer: NodeJS.Timeout | undefined;
      // A last export that failed rejects the provider's shutdown, and an entry point would end with exit 1
      // after a run that did everything; the exporter has said so already (ReportingExporter).
      const flushed = provider.shutdown().then(
        () => true,
        () => true,
      );
      const gaveUp = new Promise<false>((resolve) => {
        timer = setTimeout(() => resolve(false), shutdownMs);
      });
      if (!(await Promise.race([flushed, gaveUp]))) onShutdownTimeout?.();
      clearTimeout(timer);
    },
  };
  active = tracing;
  return tracing;
}

/**
 * Tracing to the configured OTLP collector, or undefined (and nothing started) when none is configured. For entry
 * points, which shut it down last: once shutdown gave up on the collector, the exporter's own request or retry
 * timer (the SDK's exporter cannot be cancelled) may not hold the process for the rest of the export timeout.
 */
export function startConfiguredTracing(
  config: Pick<Config, 'tracing'>,
  log: () => Logger = logger,
): Tracing | undefined {
  const { target, resource } = config.tracing;
  if (target === undefined) return undefined;
  const exporter = new ReportingExporter(otlpExporter(target), target.url, log);
  // The processor's own deadline for one export; the exporter's (the same) ends the request itself.
  const processor = new BatchSpanProcessor(exporter, { exportTimeoutMillis: target.timeoutMs });
  return startTracing(processor, {
    resource,
    onShutdownTimeout: () => {
      exporter.gaveUp(SHUTDOWN_EXPORT_MS);
      exitOnceOnlyTheExporterIsLeft();
    },
  });
}

/** How long the entry point may still take after its tracing gave up, before the exporter's leftovers are cut. */
const EXIT_GRACE_MS = 1_000;

/**
 * Ends the process, with the exit code it has, if it is still alive EXIT_GRACE_MS from now: by then the entry
 * point is done, and what holds the process is the exporter's socket to a stalled collector or its retry timer.
 * The timer is unref'd, so a process that ends by itself is not kept for it; output still being written is.
 */
function exitOnceOnlyTheExporterIsLeft(): void {
  const check = (): void => {
    const writing = process.stdout.writableLength > 0 || process.stderr.writableLength > 0;
    if (writing) setTimeout(check, 50).unref();
    else process.exit();
  };
  setTimeout(check, EXIT_GRACE_MS).unref();
}

/** The OpenTelemetry exporter for `target`'s protocol. */
function otlpExporter({ protocol, url, headers, timeoutMs }: OtlpTarget): SpanExporter {
  const options = { url, headers, timeoutMillis: timeoutMs };
  return protocol === 'http/json' ? new JsonTraceExporter(options) : new ProtobufTraceExporter(options);
}

/**
 * An exporter that says when the collector stops taking spans (once) and when it takes them again (once). The
 * processor's own reports go nowhere (OpenTelemetry's diagnostics logger is not installed), so without these a
 * broken collector would go unnoticed.
 */
export class ReportingExporter implements SpanExporter {
  private lost = 0;
  private failing = false;

  constructor(
    private readonly inner: SpanExporter,
    private readonly url: string,
    private readonly log: () => Logger = logger,
  ) {}

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.inner.export(spans, (result) => {
      if (result.code === ExportResultCode.SUCCESS) this.recovered();
      else this.failed(spans.length, exportFailure(result.error));
      done(result);
    });
  }

  /** Shutdown stopped waiting for the last export after `ms`: those spans are lost too. */
  gaveUp(ms: number): void {
    this.failed(0, `no answer within ${ms} ms at exit`);
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }

  private failed(spans: number, reason: string): void {
    this.lost += spans;
    if (this.failing) return;
    this.failing = true;
    this.log().warn(
      { otlpUrl: this.url, reason },
      `Traces could not be exported to ${this.url} (${reason}): runs go on without them; ` +
        'this is logged once, and again when the collector takes spans',
    );
  }

  private recovered(): void {
    if (!this.failing) return;
    this.log().info(
      { otlpUrl: this.url, lostSpans: this.lost },
      `Traces reach ${this.url} again; ${this.lost} span(s) were lost meanwhile`,
    );
    this.failing = false;
    this.lost = 0;
  }
}

/** An export failure in a few words: the HTTP status, the socket error's code, or the exporter's message. */
function exportFailure(err: Error | undefined): string {
  if (err === undefined) return 'the export failed';
  const status = 'code' in err ? err.code : undefined;
  if (typeof status === 'number') return `HTTP ${status}${err.message === '' ? '' : ` ${err.message}`}`;
  if (typeof status === 'string') return status;
  return err.message;
}

/** The tracing this process started, if any. */
export function activeTracing(): Tracing | undefined {
  return active;
}

/**
 * The SDK's client interceptor without spans for reads: a command waiting on runs queries and describes them
 * every round, and each would be a trace of one span. What starts or changes a run is traced as before.
 */
class ClientTracingWithoutReads extends OpenTelemetryWorkflowClientInterceptor {
  override query(
    input: WorkflowQueryInput,
    next: Next<WorkflowClientInterceptor, 'query'>,
  ): Promise<unknown> {
    return next(input);
  }

  override describe(
    input: WorkflowDescribeInput,
    next: Next<WorkflowClientInterceptor, 'describe'>,
  ): Promise<DescribeWorkflowExecutionResponse> {
    return next(input);
  }
}

/** The client interceptor that opens a document's trace when its run is started; none without tracing. */
export function clientTracingInterceptors(tracing = activeTracing()): WorkflowClientInterceptor[] {
  return tracing === undefined ? [] : [new ClientTracingWithoutReads()];
}

/** What a worker adds for tracing: activity interceptors, and the sink the workflow's spans leave through. */
export function workerTracing(tracing: Tracing): {
  activity: ActivityInterceptorsFactory[];
  sinks: InjectedSinks<OpenTelemetrySinks>;
} {
  return {
    activity: [
      (ctx) => ({
        inbound: new OpenTelemetryActivityInboundInterceptor(ctx),
        outbound: new OpenTelemetryActivityOutboundInterceptor(ctx),
      }),
    ],
    sinks: { exporter: makeWorkflowExporter(tracing.processor, tracing.resource) },
  };
}
