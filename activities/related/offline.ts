/**
 * The related step's scripted planner, the offline model's turns (no key needed): search the batch for the
 * document's key words, read the best hits, file a cross-reference to them, then answer. Each turn is decided
 * from the conversation so far, as a model would, so a turn asked again after a crash plans the same calls.
 */
import type { AgentMessage, AgentReply } from '../../src';

/** Hits the planner reads and cross-references. */
const READ_AT_MOST = 2;

export function planRelated(messages: AgentMessage[]): AgentReply {
  const results = messages.flatMap((m) => (m.role === 'tool' ? m.results : []));
  const searched = results.find((r) => r.tool === 'search');
  if (searched === undefined) {
    const task = messages[0]?.role === 'user' ? messages[0].text : '';
    return call('search', { query: keyWords(task).join(' ') });
  }
  const hits = hitsOf(searched.output).slice(0, READ_AT_MOST);
  const read = results.filter((r) => r.tool === 'read').length;
  if (read < hits.length) return call('read', { documentId: hits[read]?.documentId });
  const filed = results.find((r) => r.tool === 'fileCrossReference');
  if (filed === undefined && hits.length > 0)
    return call('fileCrossReference', {
      to: hits.map((h) => h.documentId),
      note: 'related by shared key words',
    });
  const receipt = receiptOf(filed?.output);
  return call('answer', {
    related: hits.map(({ documentId, title }) => ({ documentId, title })),
    crossReference: receipt,
  });
}

function call(tool: string, input: unknown): AgentReply {
  return {
    text: '',
    toolCalls: [{ callId: `${tool}-${Math.abs(hashOf(JSON.stringify(input)))}`, tool, input }],
  };
}

/** The document's most frequent long words (the markers and the task left out). */
function keyWords(task: string): string[] {
  const document = task.split('</document>')[0] ?? task;
  const counts = new Map<string, number>();
  for (const word of document.toLowerCase().match(/[a-z]{6,}/g) ?? [])
    if (word !== 'document') counts.set(word, (counts.get(word) ?? 0) + 1);
  return [...counts.entries()]
    .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
    .slice(0, 6)
    .map(([word]) => word);
}

function hitsOf(output: unknown): { documentId: string; title: string }[] {
  if (typeof output !== 'object' || output === null || !('hits' in output) || !Array.isArray(output.hits))
    return [];
  return output.hits.filter(
    (h): h is { documentId: string; title: string } =>
      typeof h === 'object' && h !== null && typeof h.documentId === 'string' && typeof h.title === 'string',
  );
}

function receiptOf(output: unknown): string | null {
  if (typeof output !== 'object' || output === null || !('receipt' in output)) return null;
  return typeof output.receipt === 'string' ? output.receipt : null;
}

function hashOf(text: string): number {
  let hash = 0;
  for (let i = 0; i < text.length; i++) hash = (hash * 31 + text.charCodeAt(i)) | 0;
  return hash;
}
