/**
 * The workflow-side tracing interceptors, bundled into the workflow code (so: workflow-safe, no Node builtins).
 * They are the SDK's OpenTelemetry interceptors with one change that makes one document one trace: a child
 * workflow (a batch's document) starts a trace of its own instead of joining its parent's, where the SDK would
 * put every document of a batch, and every step of each, in the batch's one trace. The document's trace opens
 * with a `StartWorkflow:<type>` span, as when a client starts the run itself, linked to the batch's
 * `StartChildWorkflow:<type>` span, which links back to it.
 *
 * Only headers change, never a command, so histories replay as before. Span and trace IDs come from the
 * sandbox's seeded Math.random, the same on every replay.
 */
import * as otel from '@opentelemetry/api';
import {
  OpenTelemetryInboundInterceptor,
  OpenTelemetryInternalsInterceptor,
  OpenTelemetryOutboundInterceptor,
  SpanName,
  SPAN_DELIMITER,
} from '@temporalio/interceptors-opentelemetry/lib/workflow';
import {
  extractContextFromHeaders,
  headersWithContext,
  instrument,
  instrumentSync,
  UPDATE_ID_ATTR_KEY,
} from '@temporalio/interceptors-opentelemetry/lib/instrumentation';
import type {
  Next,
  StartChildWorkflowExecutionInput,
  UpdateInput,
  WorkflowExecuteInput,
  WorkflowInboundCallsInterceptor,
  WorkflowInterceptors,
  WorkflowOutboundCallsInterceptor,
} from '@temporalio/workflow';
import { SdkFlags } from '@temporalio/workflow/lib/flags';
import { getActivator } from '@temporalio/workflow/lib/global-attributes';

/** The attribute naming the workflow a span started, as the SDK's client spans name it. */
const WORKFLOW_ID_ATTRIBUTE = 'temporalWorkflowId';

class OutboundWithDocumentTraces extends OpenTelemetryOutboundInterceptor {
  override startChildWorkflowExecution(
    input: StartChildWorkflowExecutionInput,
    next: Next<WorkflowOutboundCallsInterceptor, 'startChildWorkflowExecution'>,
  ): Promise<[Promise<string>, Promise<unknown>]> {
    const attributes = { [WORKFLOW_ID_ATTRIBUTE]: input.options.workflowId };
    return instrument({
      tracer: this.tracer,
      spanName: `${SpanName.CHILD_WORKFLOW_START}${SPAN_DELIMITER}${input.workflowType}`,
      fn: async (inBatch) => {
        inBatch.setAttributes(attributes);
        const opening = this.tracer.startSpan(
          `${SpanName.WORKFLOW_START}${SPAN_DELIMITER}${input.workflowType}`,
          {
            root: true,
            attributes,
            links: [{ context: inBatch.spanContext() }],
          },
        );
        inBatch.addLink({ context: opening.spanContext() });
        try {
          // The child's RunWorkflow span continues from the headers: under the opening span, in the new trace.
          const headers = otel.context.with(otel.trace.setSpan(otel.context.active(), opening), () =>
            headersWithContext(input.headers),
          );
          const started = await next({ ...input, headers });
          opening.setStatus({ code: otel.SpanStatusCode.OK });
          return started;
        } catch (err) {
          opening.setStatus({
            code: otel.SpanStatusCode.ERROR,
            message: err instanceof Error ? err.name : 'Error',
          });
          throw err;
        } finally {
          opening.end();
        }
      },
    });
  }
}

/**
 * The SDK's inbound interceptor with a run's updates in the run's trace: the SDK parents `HandleUpdate:<name>` and
 * `ValidateUpdate:<name>` on the update's headers, so a decision sent by an untraced client (or a traced one, in
 * the client's own trace) is a trace apart from its document's. Here they are children of the run's
 * `RunWorkflow:<type>` span, linked to the sender's span when its headers carry one. Spans only: no command, no
 * await more or less than the SDK's (the history does not depend on tracing, src/workflow/review.ts).
 */
class InboundWithUpdatesInTheRunTrace extends OpenTelemetryInboundInterceptor {
  /** The context of this run's `RunWorkflow` span, once the run started (module state is per workflow run). */
  private run: otel.Context | undefined;

  /** The run's context for its updates' spans; none for runs recorded before the SDK traced updates (as the SDK). */
  private runContext(): otel.Context | undefined {
    return getActivator().hasFlag(SdkFlags.OpenTelemetryInterceptorsInstrumentsAllMethods)
      ? this.run
      : undefined;
  }

  override execute(
    input: WorkflowExecuteInput,
    next: Next<WorkflowInboundCallsInterceptor, 'execute'>,
  ): Promise<unknown> {
    return super.execute(input, (inner) => {
      this.run = otel.context.active();
      return next(inner);
    });
  }

  override async handleUpdate(
    input: UpdateInput,
    next: Next<WorkflowInboundCallsInterceptor, 'handleUpdate'>,
  ): Promise<unknown> {
    const run = this.runContext();
    if (run === undefined) return super.handleUpdate(input, next);
    const links = senderLinks(input.headers);
    return await instrument({
      tracer: this.tracer,
      spanName: `${SpanName.WORKFLOW_HANDLE_UPDATE}${SPAN_DELIMITER}${input.name}`,
      fn: (span) => {
        span.setAttribute(UPDATE_ID_ATTR_KEY, input.updateId);
        for (const link of links) span.addLink(link);
        return next(input);
      },
      context: run,
    });
  }

  override validateUpdate(
    input: UpdateInput,
    next: Next<WorkflowInboundCallsInterceptor, 'validateUpdate'>,
  ): void {
    const run = this.runContext();
    if (run === undefined) return super.validateUpdate(input, next);
    const links = senderLinks(input.headers);
    instrumentSync({
      tracer: this.tracer,
      spanName: `${SpanName.WORKFLOW_VALIDATE_UPDATE}${SPAN_DELIMITER}${input.name}`,
      fn: (span) => {
        span.setAttribute(UPDATE_ID_ATTR_KEY, input.updateId);
        for (const link of links) span.addLink(link);
        next(input);
      },
      context: run,
    });
  }
}

/** A link to the span that sent an update, when its headers carry one (a traced client's). */
function senderLinks(headers: UpdateInput['headers']): otel.Link[] {
  const sender = extractContextFromHeaders(headers);
  const context = sender === undefined ? undefined : otel.trace.getSpanContext(sender);
  return context === undefined || !otel.isSpanContextValid(context) ? [] : [{ context }];
}

export const interceptors = (): WorkflowInterceptors => ({
  inbound: [new InboundWithUpdatesInTheRunTrace()],
  outbound: [new OutboundWithDocumentTraces()],
  internals: [new OpenTelemetryInternalsInterceptor()],
});
