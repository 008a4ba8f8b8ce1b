/**
 * Spans around the pipeline's own outbound calls (the model, the publish webhook), as children of the step's
 * activity span. Through the OpenTelemetry API only: without a started tracer provider (src/telemetry/tracing.ts)
 * every call here is a no-op. Attributes carry keys, names and counts, never a document's text or a secret.
 */
import { SpanStatusCode, trace } from '@opentelemetry/api';
import type { Attributes, Span } from '@opentelemetry/api';

/** The instrumentation scope of the pipeline's own spans. */
export const PIPELINE_TRACER = 'document-pipeline';

/** Runs `fn` inside a span named `name`; a throw marks the span as an error with the error's type, not its text. */
export function inSpan<T>(name: string, attributes: Attributes, fn: (span: Span) => Promise<T>): Promise<T> {
  return trace.getTracer(PIPELINE_TRACER).startActiveSpan(name, { attributes }, async (span) => {
    try {
      const result = await fn(span);
      span.setStatus({ code: SpanStatusCode.OK });
      return result;
    } catch (err) {
      // Failure messages quote answers and receivers; the type is enough to find the line in the logs.
      const type =
        err instanceof Error
          ? 'type' in err && typeof err.type === 'string'
            ? err.type
            : err.name
          : 'Error';
      span.setStatus({ code: SpanStatusCode.ERROR, message: type });
      span.setAttribute('error.type', type);
      throw err;
    } finally {
      span.end();
    }
  });
}
