/**
 * Step 4, an agent (off unless AGENT=on: docs/agent.md): the model searches the batch's other documents, reads
 * the ones it picks and files a cross-reference to them, then answers with them. Search and read only read, so a
 * retry may run them again; filing changes something at the receiver (AGENT_TOOL_URL), under the call's key
 * `<runId>:related:call-<n>`, which the receiver dedupes on.
 */
import { z } from 'zod';
import { agentTool, defineAgentStep } from '../../src';
import { planRelated } from './offline';

/** Hits a search returns. */
const SEARCH_HITS = 3;
/** Characters of a document a read returns. */
const READ_CHARS = 1_500;

const search = agentTool({
  description:
    "Search the batch's other documents for words; returns the best hits with their IDs and titles.",
  input: z.object({ query: z.string().min(1).max(300) }),
  output: z.object({
    hits: z.array(z.object({ documentId: z.string(), title: z.string(), score: z.number() })),
  }),
  changes: false,
  async run({ query }, context) {
    const words = new Set(query.toLowerCase().match(/[a-z0-9]{3,}/g) ?? []);
    const scored = [];
    for (const doc of await context.corpus()) {
      if (doc.documentId === context.documentId) continue;
      const text = (await context.read(doc.textRef)).toLowerCase();
      const score = [...words].filter((w) => text.includes(w)).length;
      if (score > 0) scored.push({ documentId: doc.documentId, title: doc.title, score });
    }
    scored.sort((a, b) => b.score - a.score || a.documentId.localeCompare(b.documentId));
    return { hits: scored.slice(0, SEARCH_HITS) };
  },
});

const read = agentTool({
  description: 'Read the beginning of one document of the batch, by its ID.',
  input: z.object({ documentId: z.string().min(1) }),
  output: z.object({ title: z.string(), text: z.string() }),
  changes: false,
  async run({ documentId }, context) {
    const doc = (await context.corpus()).find((d) => d.documentId === documentId);
    if (doc === undefined) return { title: '', text: `no document of the batch has the ID ${documentId}` };
    return { title: doc.title, text: (await context.read(doc.textRef)).slice(0, READ_CHARS) };
  },
});

const fileCrossReference = agentTool({
  description: 'File a cross-reference from this document to related documents of the batch (once per call).',
  input: z.object({ to: z.array(z.string().min(1)).min(1).max(10), note: z.string().max(500) }),
  output: z.object({ receipt: z.string().nullable(), duplicate: z.boolean() }),
  changes: true,
  async run({ to, note }, context) {
    if (context.toolUrl === undefined) return { receipt: null, duplicate: false };
    const answer = await fetch(context.toolUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'Idempotency-Key': context.idempotencyKey },
      body: JSON.stringify({ from: context.documentId, to, note }),
      signal: context.signal,
    });
    if (!answer.ok) throw new Error(`the cross-reference receiver answered HTTP ${answer.status}`);
    return z.object({ receipt: z.string(), duplicate: z.boolean() }).parse(await answer.json());
  },
});

export const related = defineAgentStep({
  name: 'related',
  resultKey: 'related',
  input: z.object({}),
  instructions: () =>
    "Find the documents of the batch most related to the document above: search the batch's other documents, " +
    'read the ones that look related, file a cross-reference to those that are, then call answer with them.',
  tools: { search, read, fileCrossReference },
  answer: z.object({
    related: z.array(z.object({ documentId: z.string(), title: z.string() })).max(10),
    crossReference: z.string().nullable(),
  }),
  maxOutputTokens: 400,
  plan: (messages) => planRelated(messages),
});
