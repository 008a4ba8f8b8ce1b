import type { temporal } from '@temporalio/proto';
import type { DataConverter, Payload } from '@temporalio/common';
import { z } from 'zod';
import { safeDecode } from './history';

type History = temporal.api.history.v1.IHistory;
type HistoryEvent = temporal.api.history.v1.IHistoryEvent;
type Failure = temporal.api.failure.v1.IFailure;

/**
 * The history with its activity results and failure messages opened by the payload codecs (decryption), so the
 * report can read them. With the codec on, a failure's message and stack travel in an encoded attributes
 * payload and the history itself says only "Encoded failure". Without codecs the history is returned as it is.
 */
export async function withDecodedResults(
  history: History,
  dataConverter: DataConverter | undefined,
): Promise<History> {
  const codecs = [...(dataConverter?.payloadCodecs ?? [])].reverse();
  if (codecs.length === 0) return history;
  const open = async (payloads: temporal.api.common.v1.IPayload[]): Promise<Payload[]> => {
    let decoded: Payload[] = payloads.map((p) => ({
      metadata: p.metadata ?? {},
      data: p.data ?? new Uint8Array(),
    }));
    for (const codec of codecs) decoded = await codec.decode(decoded);
    return decoded;
  };
  const openFailure = async (failure: Failure | null | undefined): Promise<Failure | null | undefined> => {
    if (!failure) return failure;
    const cause = await openFailure(failure.cause);
    const encoded = failure.encodedAttributes;
    if (!encoded) return { ...failure, cause };
    const [attributes] = await open([encoded]).catch(() => []);
    const message = EncodedAttributesSchema.safeParse(attributes ? safeDecode(attributes) : undefined);
    return { ...failure, cause, message: message.success ? message.data.message : failure.message };
  };
  const events = await Promise.all(
    (history.events ?? []).map(async (event): Promise<HistoryEvent> => {
      const completed = event.activityTaskCompletedEventAttributes;
      if (completed?.result?.payloads) {
        const payloads = await open(completed.result.payloads);
        return { ...event, activityTaskCompletedEventAttributes: { ...completed, result: { payloads } } };
      }
      const started = event.activityTaskStartedEventAttributes;
      if (started?.lastFailure) {
        const lastFailure = await openFailure(started.lastFailure);
        return { ...event, activityTaskStartedEventAttributes: { ...started, lastFailure } };
      }
      const failed = event.activityTaskFailedEventAttributes;
      if (failed?.failure) {
        const failure = await openFailure(failed.failure);
        return { ...event, activityTaskFailedEventAttributes: { ...failed, failure } };
      }
      return event;
    }),
  );
  return { ...history, events };
}

const EncodedAttributesSchema = z.object({ message: z.string() });
