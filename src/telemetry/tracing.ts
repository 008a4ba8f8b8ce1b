/**
 * OpenTelemetry tracing: one document is one trace. The client's start span travels in the workflow's headers, the
 * workflow's spans (run, and one per scheduled step) are made in the sandbox and handed out through a sink, each
 * step's activity span continues from the headers Temporal gives it, and the model and publish calls are spans
 * inside those (src/telemetry/spans.ts). All of that is the SDK's interceptors; this module only starts a tracer
 * provider and wires them in. Spans leave over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set; otherwise no
 * provider is started and nothing is traced.
 */
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { Resource } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { SpanProcessor } from '@opentelemetry/sdk-trace-base';
import {
  makeWorkflowExporter,
  OpenTelemetryActivityInboundInterceptor,
  OpenTelemetryActivityOutboundInterceptor,
  OpenTelemetryWorkflowClientInterceptor,
} from '@temporalio/interceptors-opentelemetry';
import type { WorkflowClientInterceptor } from '@temporalio/client';
import type { OpenTelemetrySinks } from '@temporalio/interceptors-opentelemetry';
import type { ActivityInterceptorsFactory, InjectedSinks } from '@temporalio/worker';
import type { Config } from '../config';

/** `service.name` of every span the pipeline exports. */
export const SERVICE_NAME = 'document-pipeline';

/**
 * The workflow-side interceptors, as a module the bundler adds to the workflow code. A prebuilt bundle gets them
 * only if it was built with them: `bundleWorkflowCode({ workflowInterceptorModules: [WORKFLOW_TRACING_MODULE] })`.
 */
export const WORKFLOW_TRACING_MODULE =
  require.resolve('@temporalio/interceptors-opentelemetry/lib/workflow-interceptors');

export interface Tracing {
  /** Receives every finished span: the Node side's from the provider, the workflow's through the sink. */
  processor: SpanProcessor;
  resource: Resource;
  /** Exports what is buffered and stops. */
  shutdown(): Promise<void>;
}

let active: Tracing | undefined;

/**
 * Starts this process's tracer provider over `processor` and registers it globally, with W3C trace-context
 * propagation and async-local context (so a span started in an activity is a child of the activity's span).
 */
export function startTracing(processor: SpanProcessor): Tracing {
  if (active !== undefined) throw new Error('tracing is already started in this process');
  const resource = new Resource({ 'service.name': SERVICE_NAME });
  const provider = new BasicTracerProvider({ resource, spanProcessors: [processor] });
  provider.register({
    contextManager: new AsyncLocalStorageContextManager().enable(),
    propagator: new W3CTraceContextPropagator(),
  });
  const tracing: Tracing = {
    processor,
    resource,
    shutdown: async () => {
      await provider.shutdown();
      if (active === tracing) active = undefined;
    },
  };
  active = tracing;
  return tracing;
}

/** Tracing to the configured OTLP/HTTP collector, or undefined (and nothing started) when none is configured. */
export function startConfiguredTracing(config: Pick<Config, 'otlpEndpoint'>): Tracing | undefined {
  if (config.otlpEndpoint === undefined) return undefined;
  const url = `${config.otlpEndpoint.replace(/\/+$/, '')}/v1/traces`;
  return startTracing(new BatchSpanProcessor(new OTLPTraceExporter({ url })));
}

/** The tracing this process started, if any. */
export function activeTracing(): Tracing | undefined {
  return active;
}

/** The client interceptor that opens a document's trace when its run is started; none without tracing. */
export function clientTracingInterceptors(tracing = activeTracing()): WorkflowClientInterceptor[] {
  return tracing === undefined ? [] : [new OpenTelemetryWorkflowClientInterceptor()];
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
