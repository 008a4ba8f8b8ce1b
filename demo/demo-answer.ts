/**
 * What the demo model answers, from the document alone: its first sentence, or, when the request asks for a JSON
 * schema, a value that satisfies the schema, filled from that sentence and the document's most frequent words. It
 * reads what the request asks for, never which step asks, so a new step gets a sensible answer unchanged.
 */
import { z } from 'zod';

/** The demo model's answer: the document's first sentence, or a JSON value that satisfies `schema` as JSON text. */
export function demoAnswer(document: string, schema: unknown): string {
  if (schema === undefined) return firstSentence(document);
  return JSON.stringify(valueFor(schema, { root: schema, document, depth: 0 }));
}

/** Tags the demo gives an array of strings unless its minItems or maxItems say otherwise. */
const DEFAULT_TAGS = 3;

/**
 * How deep the answer fills everything: below it, objects get their required properties only and arrays their
 * minItems, so a recursive schema (a tree of sections) ends.
 */
const MAX_DEPTH = 6;

/** A plausible value for each string format a schema may name, where the first sentence would not do. */
const FORMATS: Record<string, string> = {
  'date-time': '2026-01-01T00:00:00Z',
  date: '2026-01-01',
  time: '00:00:00Z',
  email: 'demo@example.com',
  uri: 'https://example.com/',
  url: 'https://example.com/',
  uuid: '00000000-0000-4000-8000-000000000000',
};

/** The JSON Schema keywords the demo reads; any other keyword is ignored. */
const KeywordsSchema = z.object({
  $ref: z.string().optional(),
  type: z.union([z.string(), z.array(z.string())]).optional(),
  const: z.unknown().optional(),
  enum: z.array(z.unknown()).optional(),
  anyOf: z.array(z.unknown()).optional(),
  oneOf: z.array(z.unknown()).optional(),
  allOf: z.array(z.unknown()).optional(),
  properties: z.record(z.string(), z.unknown()).optional(),
  required: z.array(z.string()).optional(),
  // An array of schemas is draft-07's tuple; 2020-12 names it prefixItems.
  items: z.unknown().optional(),
  prefixItems: z.array(z.unknown()).optional(),
  minItems: z.number().int().nonnegative().optional(),
  maxItems: z.number().int().nonnegative().optional(),
  minLength: z.number().int().nonnegative().optional(),
  maxLength: z.number().int().nonnegative().optional(),
  format: z.string().optional(),
  minimum: z.number().optional(),
  maximum: z.number().optional(),
  // A number since draft 6; a flag on minimum/maximum in draft 4.
  exclusiveMinimum: z.union([z.number(), z.boolean()]).optional(),
  exclusiveMaximum: z.union([z.number(), z.boolean()]).optional(),
  description: z.string().optional(),
});
type Keywords = z.infer<typeof KeywordsSchema>;

/**
 * The limits a description may state instead of a keyword. A provider whose structured outputs refuse limit
 * keywords gets them in the description, which its model reads: @ai-sdk/anthropic turns `maxLength: 80` into
 * "max length: 80." (the keyword's words, lower case, then its value; several joined by "; ").
 */
const LIMITS_IN_WORDS = [
  'minimum',
  'maximum',
  'exclusiveMinimum',
  'exclusiveMaximum',
  'minLength',
  'maxLength',
  'minItems',
  'maxItems',
] as const;

interface Context {
  /** The whole schema, which `$ref`s point into. */
  root: unknown;
  document: string;
  /** How many schemas down from the root this one is. */
  depth: number;
}

/** A schema's keywords; a schema the demo cannot read (`true`, a keyword of the wrong type) allows anything. */
function keywordsOf(schema: unknown): Keywords {
  const parsed = KeywordsSchema.safeParse(schema);
  if (!parsed.success) return {};
  const keywords = parsed.data;
  const description = keywords.description;
  if (description === undefined) return keywords;
  const stated: Partial<Record<(typeof LIMITS_IN_WORDS)[number], number>> = {};
  for (const limit of LIMITS_IN_WORDS) {
    const words = limit.replace(/[A-Z]/g, (letter) => ` ${letter.toLowerCase()}`);
    const value = new RegExp(`(?:^|; |\\n)${words}: (-?\\d+(?:\\.\\d+)?(?:e[+-]?\\d+)?)`).exec(
      description,
    )?.[1];
    if (value !== undefined) stated[limit] = Number(value);
  }
  // A keyword the schema has wins over the words; words that make no limit (a length of -1) are ignored.
  const merged = KeywordsSchema.safeParse({ ...stated, ...keywords });
  return merged.success ? merged.data : keywords;
}

/** The schema a local `$ref` (`#/$defs/section`) points to; undefined for any other reference. */
function resolveRef(root: unknown, ref: string): unknown {
  if (!ref.startsWith('#')) return undefined;
  let node = root;
  for (const part of ref.slice(1).split('/').filter(Boolean)) {
    const key = decodeURIComponent(part).replace(/~1/g, '/').replace(/~0/g, '~');
    if (!isRecord(node) || !Object.hasOwn(node, key)) return undefined;
    node = node[key];
  }
  return node;
}

/** The schema itself, or what its chain of `$ref`s ends in (up to a few links). */
function followRefs(schema: unknown, root: unknown): unknown {
  let node = schema;
  for (let links = 0; links < 8; links++) {
    const ref = keywordsOf(node).$ref;
    const target = ref === undefined ? undefined : resolveRef(root, ref);
    if (target === undefined) return node;
    node = target;
  }
  return node;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null;
}

/** A value that satisfies `schema`, filled from the document. */
function valueFor(schema: unknown, context: Context): unknown {
  const keywords = keywordsOf(schema);
  const deeper = { ...context, depth: context.depth + 1 };
  if (keywords.$ref !== undefined) {
    const target = resolveRef(context.root, keywords.$ref);
    // A schema that refers to itself without end gets a string once it is twice MAX_DEPTH deep.
    if (target !== undefined && context.depth <= MAX_DEPTH * 2) return valueFor(target, deeper);
  }
  if (Object.hasOwn(keywords, 'const')) return keywords.const;
  if (keywords.enum !== undefined && keywords.enum.length > 0) return keywords.enum[0];
  const options = keywords.anyOf ?? keywords.oneOf;
  if (options !== undefined && options.length > 0) {
    // The first option that is not null: an optional value is still worth showing.
    const option = options.find((o) => keywordsOf(o).type !== 'null') ?? options[0];
    return valueFor(option, deeper);
  }
  const merged = keywords.allOf === undefined ? keywords : mergeAllOf(keywords, context.root);
  switch (typeOf(merged)) {
    case 'object':
      return objectFor(merged, deeper);
    case 'array':
      return arrayFor(merged, deeper);
    case 'number':
      return numberFor(merged, false);
    case 'integer':
      return numberFor(merged, true);
    case 'boolean':
      return true;
    case 'null':
      return null;
    default:
      return stringFor(merged, firstSentence(context.document));
  }
}

/** The type the answer takes: the first one named other than null, or the one the keywords imply. */
function typeOf(keywords: Keywords): string {
  const types = typeof keywords.type === 'string' ? [keywords.type] : (keywords.type ?? []);
  const type = types.find((t) => t !== 'null') ?? types[0];
  if (type !== undefined) return type;
  if (keywords.properties !== undefined) return 'object';
  if (keywords.items !== undefined || keywords.prefixItems !== undefined) return 'array';
  return 'string';
}

/** A schema with its allOf parts folded in: their properties and required names added, other keywords kept. */
function mergeAllOf(keywords: Keywords, root: unknown): Keywords {
  const { allOf, ...rest } = keywords;
  let merged: Keywords = rest;
  for (const part of allOf ?? []) {
    const own = keywordsOf(followRefs(part, root));
    const properties =
      own.properties === undefined ? merged.properties : { ...own.properties, ...merged.properties };
    const required =
      own.required === undefined ? merged.required : [...(merged.required ?? []), ...own.required];
    merged = {
      ...own,
      ...merged,
      ...(properties === undefined ? {} : { properties }),
      ...(required === undefined ? {} : { required }),
    };
  }
  return merged;
}

function objectFor(keywords: Keywords, context: Context): Record<string, unknown> {
  const required = new Set(keywords.required ?? []);
  const entries = Object.entries(keywords.properties ?? {}).filter(
    ([name]) => context.depth <= MAX_DEPTH || required.has(name),
  );
  return Object.fromEntries(entries.map(([name, schema]) => [name, valueFor(schema, context)]));
}

function arrayFor(keywords: Keywords, context: Context): unknown[] {
  const tuple = keywords.prefixItems ?? (Array.isArray(keywords.items) ? keywords.items : []);
  const rest = Array.isArray(keywords.items) ? undefined : keywords.items;
  const min = keywords.minItems ?? 0;
  const max = keywords.maxItems ?? Infinity;
  const head = tuple.slice(0, max).map((item) => valueFor(item, context));
  const item = keywordsOf(followRefs(rest, context.root));
  if (rest !== undefined && isPlainString(item)) {
    const count = Math.max(clamp(DEFAULT_TAGS, min, max) - head.length, 0);
    const words = frequentWords(context.document, count).slice(0, count);
    while (words.length < min - head.length) words.push(`topic-${words.length + 1}`);
    return [...head, ...words.map((word) => stringFor(item, word))];
  }
  const wanted = context.depth <= MAX_DEPTH ? clamp(Math.max(head.length, 1), min, max) : min;
  const tail = Array.from({ length: Math.max(wanted - head.length, 0) }, () => valueFor(rest, context));
  return [...head, ...tail];
}

/** A string item with no enum, const or format of its own: the document's words fit it. */
function isPlainString(item: Keywords): boolean {
  return (
    typeOf(item) === 'string' &&
    item.enum === undefined &&
    !Object.hasOwn(item, 'const') &&
    item.format === undefined &&
    item.anyOf === undefined &&
    item.oneOf === undefined
  );
}

/** `text` fitted to the string's format and length limits (counted in characters, as JSON Schema counts). */
function stringFor(keywords: Keywords, text: string): string {
  let chars = [...(FORMATS[keywords.format ?? ''] ?? text)];
  const max = keywords.maxLength;
  if (max !== undefined && chars.length > max) chars = max > 1 ? [...chars.slice(0, max - 1), '…'] : [];
  const min = keywords.minLength ?? 0;
  while (chars.length < min) chars.push('.');
  return chars.join('');
}

/** 0.5 (an integer: 1) when the limits allow it, else the nearest value inside them. */
function numberFor(keywords: Keywords, integer: boolean): number {
  const { minimum, maximum, exclusiveMinimum, exclusiveMaximum } = keywords;
  let low = minimum ?? -Infinity;
  let lowOpen = exclusiveMinimum === true;
  if (typeof exclusiveMinimum === 'number' && exclusiveMinimum >= low)
    [low, lowOpen] = [exclusiveMinimum, true];
  let high = maximum ?? Infinity;
  let highOpen = exclusiveMaximum === true;
  if (typeof exclusiveMaximum === 'number' && exclusiveMaximum <= high)
    [high, highOpen] = [exclusiveMaximum, true];
  if (integer) {
    const first = lowOpen ? Math.floor(low) + 1 : Math.ceil(low);
    const last = highOpen ? Math.ceil(high) - 1 : Math.floor(high);
    return clamp(1, first, last);
  }
  const wanted = 0.5;
  if (wanted < low || (lowOpen && wanted === low)) {
    if (!lowOpen) return low;
    return Number.isFinite(high) ? (low + high) / 2 : low + 1;
  }
  if (wanted > high || (highOpen && wanted === high)) {
    if (!highOpen) return high;
    return Number.isFinite(low) ? (low + high) / 2 : high - 1;
  }
  return wanted;
}

/** `value` within [min, max]; min when the range is empty. */
function clamp(value: number, min: number, max: number): number {
  return Math.max(min, Math.min(value, max));
}

/** The Markdown's prose without headings, code fences and emphasis marks, on one line. */
function prose(markdown: string): string {
  return markdown
    .replace(/```[\s\S]*?```/g, ' ')
    .split('\n')
    .filter((line) => !/^\s*(#|[-*_]{3,}\s*$|\|)/.test(line))
    .join(' ')
    .replace(/[*_`>]/g, '')
    .replace(/\s+/g, ' ')
    .trim();
}

/** The demo model's summary: the first sentence of the text, at most 200 characters. */
function firstSentence(markdown: string): string {
  const text = prose(markdown);
  const sentence = /^.+?[.!?](?=\s|$)/.exec(text)?.[0] ?? text;
  const short = sentence.length > 200 ? `${sentence.slice(0, 199)}…` : sentence;
  return short === '' ? 'An empty document.' : short;
}

/**
 * The demo model's tags: the text's `count` most frequent words of six letters or more (fewer when the text has
 * fewer; "document" when it has none).
 */
function frequentWords(markdown: string, count: number): string[] {
  const counts = new Map<string, number>();
  for (const word of prose(markdown)
    .toLowerCase()
    .match(/\p{L}{6,}/gu) ?? [])
    counts.set(word, (counts.get(word) ?? 0) + 1);
  const words = [...counts.entries()].sort((a, b) => b[1] - a[1]).map(([word]) => word);
  return words.length > 0 ? words.slice(0, count) : ['document'];
}
