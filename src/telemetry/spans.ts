/**
 * Spans around the pipeline's own outbound calls (the model, the publish webhook), as children of the step's
 * activity span. Through the OpenTelemetry API only: without a started tracer provider (src/telemetry/tracing.ts)
 * every call here is a no-op. Attributes carry keys, names and counts, never a document's text or a secret.
 */
import { SpanStatusCode, trace } from '@opentelemetry/api';
import type { Attributes, Span } from '@opentelemetry/api';
import type { ModelInfo, Usage } from '../contract';

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

/**
 * The OpenTelemetry GenAI attributes known before a model call (semantic conventions for GenAI client spans,
 * "development" status): set them when the call's span starts. `gen_ai.provider.name` replaces `gen_ai.system`.
 */
export function genAiRequestAttributes(model: ModelInfo): Attributes {
  return {
    'gen_ai.operation.name': 'chat',
    'gen_ai.provider.name': model.provider,
    'gen_ai.request.model': model.model,
  };
}

/**
 * The OpenTelemetry GenAI attributes of a model call's answer: its tokens, the prompt cache's share of the input
 * when the provider reported one (included in `gen_ai.usage.input_tokens`, as the conventions ask), and the
 * estimated cost in US dollars as `pipeline.cost_usd` when the price table knows the model.
 */
export function genAiUsageAttributes(usage: Usage, costUsd: number | null): Attributes {
  const attributes: Attributes = {
    'gen_ai.operation.name': 'chat',
    'gen_ai.usage.input_tokens': usage.inputTokens,
    'gen_ai.usage.output_tokens': usage.outputTokens,
  };
  if (usage.cachedInputTokens !== undefined)
    attributes['gen_ai.usage.cache_read.input_tokens'] = usage.cachedInputTokens;
  if (usage.cacheWriteInputTokens !== undefined)
    attributes['gen_ai.usage.cache_creation.input_tokens'] = usage.cacheWriteInputTokens;
  if (costUsd !== null) attributes['pipeline.cost_usd'] = costUsd;
  return attributes;
}
