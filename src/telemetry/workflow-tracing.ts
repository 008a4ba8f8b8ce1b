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
import { headersWithContext, instrument } from '@temporalio/interceptors-opentelemetry/lib/instrumentation';
import type {
  Next,
  StartChildWorkflowExecutionInput,
  WorkflowInterceptors,
  WorkflowOutboundCallsInterceptor,
} from '@temporalio/workflow';

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

export const interceptors = (): WorkflowInterceptors => ({
  inbound: [new OpenTelemetryInboundInterceptor()],
  outbound: [new OutboundWithDocumentTraces()],
  internals: [new OpenTelemetryInternalsInterceptor()],
});
