/**
 * The offline model's own thread (see OfflineModel): it scores texts with offline-nlp.ts, away from the event loop
 * of the process that asked. Loaded only as a thread's module; on a main thread it does nothing.
 */
import { parentPort } from 'node:worker_threads';
import { serveRequests } from '../lib/thread';
import { countTokens, extractiveSummary, keywordTags } from './offline-nlp';
import type { ModelAnswer } from './types';

export type OfflineRequest =
  { op: 'summarize'; text: string; maxSentences: number } | { op: 'tag'; text: string; maxTags: number };

export type OfflineAnswer = ModelAnswer<string> | ModelAnswer<string[]>;

/** One request's answer, with the tokens the text and the answer count. */
export function answer(request: OfflineRequest): OfflineAnswer {
  const inputTokens = countTokens(request.text);
  if (request.op === 'summarize') {
    const summary = extractiveSummary(request.text, request.maxSentences);
    return { value: summary, usage: { inputTokens, outputTokens: countTokens(summary) } };
  }
  const tags = keywordTags(request.text, request.maxTags);
  return { value: tags, usage: { inputTokens, outputTokens: tags.length } };
}

if (parentPort !== null) serveRequests(parentPort, answer);
