/**
 * Bad input, generated: malformed workflow inputs through the workflow's own validation (as pure functions and as
 * real runs on the time-skipping server), random bytes through the document checks, and a batch of good and bad
 * files through the batch runner, rerun after the bad ones are fixed.
 */
import '../src/cli/compose';
import { describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import { isUtf8 } from 'node:buffer';
import fs from 'node:fs';
import path from 'node:path';
import { createHash, randomUUID } from 'node:crypto';
import fc from 'fast-check';
import { ApplicationFailure } from '@temporalio/common';
import { Client, WorkflowFailedError } from '@temporalio/client';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { processDocuments } from '../src/runs/batch';
import { loadConfig } from '../src/config';
import { estimateCost } from '../src/model/pricing';
import { dataPaths } from '../src/config';
import { collectDocuments, decodeDocument, documentIdOf } from '../src/documents/files';
import {
  FailureType,
  INPUT_SCHEMA_VERSION,
  parseOrFail,
  refuseOtherSchemaVersions,
  PipelineInputSchema,
  workflowIdFor,
} from '../src/contract';
import { createPipelineWorker } from '../src/temporal/worker';
import type { documentPipeline } from '../workflows';
import {
  installQuietRuntime,
  pipelineInput,
  pipelineWorker,
  SAMPLE_TEXT,
  tempParts,
  timeSkippingEnv,
  workflowBundle,
} from './helpers';
import { cleanupAfterAll, scratchDir } from './scratch';

let env: TestWorkflowEnvironment;
const defer = cleanupAfterAll();

before(async () => {
  // Every run here fails on purpose; the SDK would log each one as a warning.
  installQuietRuntime();
  env = await timeSkippingEnv(defer);
});

/**
 * A plain client on the time-skipping server. The env's own client unlocks time skipping around every result()
 * call; many such calls at once (the batch runner follows all its runs in parallel) unbalance the server's lock
 * and it jumps years ahead, timing out runs that are still working. Nothing here needs skipped time.
 */
function plainClient(): Client {
  return new Client({ connection: env.connection, namespace: env.namespace ?? 'default' });
}

// ---------------------------------------------------------------------------------------------------------------
// Generators: valid inputs, and malformed ones that carry the field paths a good message must name.
// ---------------------------------------------------------------------------------------------------------------

const TOP_FIELDS = ['schemaVersion', 'documentId', 'textRef', 'title', 'options'] as const;
const OPTION_FIELDS = ['maxSummarySentences', 'maxTags', 'modelTimeoutSeconds', 'stepBudgetMinutes'] as const;
const OPTION_MAX = {
  maxSummarySentences: 20,
  maxTags: 20,
  modelTimeoutSeconds: 3600,
  stepBudgetMinutes: 7 * 24 * 60,
} as const;
const OPTION_DEFAULTS = {
  maxSummarySentences: 3,
  maxTags: 5,
  modelTimeoutSeconds: 120,
  stepBudgetMinutes: 60,
} as const;
/** Every path a message may blame; `(root)` is the input itself (not an object, or unknown top-level fields). */
const BLAMEABLE = ['(root)', ...TOP_FIELDS, ...OPTION_FIELDS.map((f) => `options.${f}`)];

const DOCUMENT_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const TEXT_REF = /^sha256:[0-9a-f]{64}$/;

const validDocumentId = fc.stringMatching(DOCUMENT_ID);
const validTextRef = fc.stringMatching(/^[0-9a-f]{64}$/).map((hex) => `sha256:${hex}`);
const validTitle = fc.oneof(
  fc.string({ unit: 'binary', minLength: 1, maxLength: 150 }),
  fc.constant('t'.repeat(300)),
);
const validOptions = fc.record(
  {
    maxSummarySentences: fc.integer({ min: 1, max: 20 }),
    maxTags: fc.integer({ min: 1, max: 20 }),
    modelTimeoutSeconds: fc.integer({ min: 1, max: 3600 }),
    stepBudgetMinutes: fc.integer({ min: 1, max: 7 * 24 * 60 }),
  },
  { requiredKeys: [] },
);
const validInput = fc.record(
  {
    schemaVersion: fc.constant(INPUT_SCHEMA_VERSION),
    documentId: validDocumentId,
    textRef: validTextRef,
    title: validTitle,
    options: validOptions,
  },
  { requiredKeys: ['schemaVersion', 'documentId', 'textRef', 'title'] },
);

/** Values of every JSON type but string; each survives the trip through the payload converter still wrong. */
const notAString = fc.oneof(
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
  fc.array(fc.string(), { maxLength: 3 }),
  fc.dictionary(fc.string(), fc.string(), { maxKeys: 3 }),
);
const notANumber = fc.oneof(
  fc.string(),
  fc.integer({ min: 1, max: 20 }).map(String),
  fc.boolean(),
  fc.constant(null),
  fc.array(fc.integer(), { maxLength: 3 }),
  fc.dictionary(fc.string(), fc.integer(), { maxKeys: 3 }),
);
const notAnObject = fc.oneof(
  fc.string(),
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
  fc.array(fc.jsonValue(), { maxLength: 3 }),
);
/**
 * Names for fields the schema does not know; no ":" so a name can never pass for a path in a message. The names
 * of Object.prototype come often: `__proto__` once set the prototype instead of adding a field (1 run in 8 failed).
 */
const unknownName = (known: readonly string[]) =>
  fc.oneof(
    fc.constantFrom('__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf'),
    fc
      .string({ unit: 'binary', minLength: 1, maxLength: 20 })
      .filter((k) => !known.includes(k) && !k.includes(':')),
  );

/** Adds `name` as an own field, whatever it is: plain assignment to `__proto__` would set the prototype instead. */
function setField(target: Record<string, unknown>, name: string, value: unknown): void {
  Object.defineProperty(target, name, { value, enumerable: true, writable: true, configurable: true });
}

type Input = Record<string, unknown>;
interface Fault {
  /** Faults on one slot exclude each other; all `options...` faults share one slot. */
  slot: string;
  /** The path the message must blame. */
  blames: string;
  /** For unknown fields: the names the message must quote. */
  quotes: string[];
  what: string;
  apply(input: Input): void;
}

/** A value as a failing case should print it: NaN and -0 as themselves, undefined as "undefined". */
const show = (value: unknown): string =>
  typeof value === 'number' || value === undefined ? String(value) : JSON.stringify(value);
const fault = (
  slot: string,
  what: string,
  apply: (input: Input) => void,
  blames = slot,
  quotes: string[] = [],
): Fault => ({ slot, blames, quotes, what, apply });
const replaceWith = (field: string, what: string) => (value: unknown) =>
  fault(field, `${field} ${what}: ${show(value)}`, (input) => {
    input[field] = value;
  });
const missing = (field: string) =>
  fc.constant(
    fault(field, `${field} missing`, (input) => {
      delete input[field];
    }),
  );

const badDocumentId = fc.oneof(
  fc.constant(''),
  fc.integer({ min: 129, max: 400 }).map((n) => 'a'.repeat(n)),
  fc.tuple(fc.constantFrom('.', '_', ':', '-'), validDocumentId).map(([c, id]) => `${c}${id}`.slice(0, 128)),
  fc
    .tuple(validDocumentId, fc.constantFrom('/', ' ', '\\', '?', '#', '%', 'é', '\u0000', '\n', '*'))
    .map(([id, c]) => `${id.slice(0, 100)}${c}`),
  fc.string({ unit: 'binary' }).filter((s) => !DOCUMENT_ID.test(s)),
);
const badTextRef = fc.oneof(
  fc.constant(''),
  fc.stringMatching(/^[0-9a-f]{64}$/),
  fc.stringMatching(/^[0-9a-f]{63}[A-F]$/).map((hex) => `sha256:${hex}`),
  fc.stringMatching(/^[0-9a-f]{1,63}$/).map((hex) => `sha256:${hex}`),
  fc.stringMatching(/^[0-9a-f]{65,80}$/).map((hex) => `sha256:${hex}`),
  fc.stringMatching(/^[0-9a-f]{40}$/).map((hex) => `sha1:${hex}`),
  fc.string({ unit: 'binary' }).filter((s) => !TEXT_REF.test(s)),
);
const badTitle = fc.oneof(
  fc.constant(''),
  fc.integer({ min: 301, max: 2000 }).map((n) => 'x'.repeat(n)),
);
const otherSchemaVersion = fc.oneof(
  fc.constantFrom(0, 2, 3, -1, 1.5),
  fc.integer().filter((n) => n !== INPUT_SCHEMA_VERSION),
  fc.double().filter((n) => n !== INPUT_SCHEMA_VERSION),
);
const badOptionValue = (field: (typeof OPTION_FIELDS)[number]) =>
  fc.oneof(
    fc.integer({ max: 0 }),
    fc.integer({ min: OPTION_MAX[field] + 1 }),
    fc.double({ min: 1.01, max: OPTION_MAX[field] - 0.01, noNaN: true }).filter((n) => !Number.isInteger(n)),
    fc.constantFrom(Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY),
    notANumber,
  );
const withOptions = (input: Input): Input => {
  const options = input.options;
  const copy: Input = typeof options === 'object' && options !== null ? { ...options } : {};
  input.options = copy;
  return copy;
};

const faults: fc.Arbitrary<Fault> = fc.oneof(
  missing('schemaVersion'),
  notANumber.map(replaceWith('schemaVersion', 'of the wrong type')),
  otherSchemaVersion.map(replaceWith('schemaVersion', 'old or new')),
  missing('documentId'),
  notAString.map(replaceWith('documentId', 'of the wrong type')),
  badDocumentId.map(replaceWith('documentId', 'malformed')),
  missing('textRef'),
  notAString.map(replaceWith('textRef', 'of the wrong type')),
  badTextRef.map(replaceWith('textRef', 'malformed')),
  missing('title'),
  notAString.map(replaceWith('title', 'of the wrong type')),
  badTitle.map(replaceWith('title', 'empty or too long')),
  notAnObject.map((value) =>
    fault('options', `options not an object: ${show(value)}`, (input) => {
      input.options = value;
    }),
  ),
  fc
    .constantFrom(...OPTION_FIELDS)
    .chain((field) => badOptionValue(field).map((value) => ({ field, value })))
    .map(({ field, value }) =>
      fault(
        'options',
        `options.${field} = ${show(value)}`,
        (input) => {
          withOptions(input)[field] = value;
        },
        `options.${field}`,
      ),
    ),
  fc
    .tuple(unknownName(TOP_FIELDS), fc.jsonValue())
    .map(([name, value]) =>
      fault('unknown', `unknown field ${show(name)}`, (input) => setField(input, name, value), '(root)', [
        name,
      ]),
    ),
  fc
    .tuple(unknownName(OPTION_FIELDS), fc.jsonValue())
    .map(([name, value]) =>
      fault(
        'options',
        `unknown option ${show(name)}`,
        (input) => setField(withOptions(input), name, value),
        'options',
        [name],
      ),
    ),
);

interface Malformed {
  input: unknown;
  /** The paths the message must blame, and only those. */
  blames: Set<string>;
  quotes: string[];
  what: string;
}

const malformedObject: fc.Arbitrary<Malformed> = fc
  .tuple(validInput, fc.uniqueArray(faults, { minLength: 1, maxLength: 3, selector: (f) => f.slot }))
  .map(([valid, chosen]) => {
    const input: Input = structuredClone(valid);
    for (const f of chosen) f.apply(input);
    return {
      input,
      blames: new Set(chosen.map((f) => f.blames)),
      quotes: chosen.flatMap((f) => f.quotes),
      what: chosen.map((f) => f.what).join(' + '),
    };
  });
const notAnObjectAtAll: fc.Arbitrary<Malformed> = fc
  .oneof(
    fc.constant(null),
    fc.constant(undefined),
    fc.string(),
    fc.double(),
    fc.boolean(),
    fc.array(fc.jsonValue(), { maxLength: 4 }),
    validInput.map((v) => [v]),
  )
  .map((input) => ({ input, blames: new Set(['(root)']), quotes: [], what: `input ${show(input)}` }));
const malformedInput = fc.oneof(
  { weight: 6, arbitrary: malformedObject },
  { weight: 1, arbitrary: notAnObjectAtAll },
);

/** True when `message` has an issue for exactly `fieldPath` (issues are joined with "; "). */
function blamesPath(message: string, fieldPath: string): boolean {
  return message.startsWith(`Invalid pipeline input: ${fieldPath}: `) || message.includes(`; ${fieldPath}: `);
}

/** Checks an InvalidInput failure: blames every faulted path and no other, quotes every unknown field name. */
function assertNamesFields(failure: ApplicationFailure, bad: Malformed): void {
  const context = `${bad.what}\n  -> ${failure.message}`;
  assert.equal(failure.type, FailureType.InvalidInput, context);
  assert.equal(failure.nonRetryable, true, context);
  const blamed = BLAMEABLE.filter((p) => blamesPath(failure.message, p));
  assert.deepEqual(new Set(blamed), bad.blames, context);
  for (const name of bad.quotes) {
    assert.ok(failure.message.includes(`unknown field(s)`), context);
    assert.ok(failure.message.includes(`"${name}"`), context);
  }
}

/** Rejects when `promise` has not settled within `ms`: a run stuck in Running fails the test instead of hanging it. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: still running after ${ms} ms`)), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

/** What the workflow receives: the input after the JSON payload converter (NaN becomes null, undefined vanishes). */
function overTheWire(value: unknown): unknown {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

/** The workflow refuses other schema versions before validating anything else. */
function otherVersionOf(input: unknown): number | undefined {
  if (
    typeof input !== 'object' ||
    input === null ||
    Array.isArray(input) ||
    !Object.hasOwn(input, 'schemaVersion')
  )
    return undefined;
  const version: unknown = Reflect.get(input, 'schemaVersion');
  return typeof version === 'number' && version !== INPUT_SCHEMA_VERSION ? version : undefined;
}

describe('user-chosen names meet plain objects', () => {
  it('a model named like an Object.prototype key has no price (n/a), not NaN', () => {
    const { prices } = loadConfig({
      MODEL_PRICES: '{"my-model": {"inputPerMillion": 1, "outputPerMillion": 2}}',
    });
    const usage = { inputTokens: 10, outputTokens: 10 };
    for (const model of ['constructor', 'toString', '__proto__', 'hasOwnProperty']) {
      assert.equal(estimateCost(prices, { provider: 'openai', model }, usage), null, model);
    }
    assert.equal(estimateCost(prices, { provider: 'openai', model: 'my-model' }, usage), 0.00003);
  });
});

describe('malformed workflow inputs', () => {
  it('parseOrFail(PipelineInputSchema) refuses 1,500 of them with InvalidInput naming each bad field', async () => {
    fc.assert(
      fc.property(malformedInput, (bad) => {
        assert.throws(
          () => parseOrFail(PipelineInputSchema, bad.input, 'pipeline input'),
          (err) => {
            assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
            assertNamesFields(err, bad);
            return true;
          },
          bad.what,
        );
      }),
      { numRuns: 1_500 },
    );
  });

  it("names Object.prototype's keys as unknown fields, in process and over the wire (regression: __proto__)", () => {
    for (const name of ['__proto__', 'constructor', 'toString']) {
      for (const where of ['(root)', 'options'] as const) {
        const input: Input = {
          schemaVersion: INPUT_SCHEMA_VERSION,
          documentId: 'doc-1',
          textRef: `sha256:${'a'.repeat(64)}`,
          title: 't',
        };
        setField(where === '(root)' ? input : withOptions(input), name, { schemaVersion: 2 });
        const bad: Malformed = { input, blames: new Set([where]), quotes: [name], what: `${where} ${name}` };
        for (const sent of [input, overTheWire(input)]) {
          assert.throws(
            () => {
              refuseOtherSchemaVersions(sent);
              parseOrFail(PipelineInputSchema, sent, 'pipeline input');
            },
            (err) => {
              assert.ok(err instanceof ApplicationFailure, String(err));
              assertNamesFields(err, { ...bad, input: sent });
              return true;
            },
          );
        }
      }
    }
  });

  it("the workflow's own order (version check, then schema) refuses 1,000 of them with the right type", async () => {
    fc.assert(
      fc.property(malformedInput, (bad) => {
        assert.throws(
          () => {
            refuseOtherSchemaVersions(bad.input);
            parseOrFail(PipelineInputSchema, bad.input, 'pipeline input');
          },
          (err) => {
            assert.ok(err instanceof ApplicationFailure, `expected ApplicationFailure, got ${String(err)}`);
            assert.equal(err.nonRetryable, true);
            const version = otherVersionOf(bad.input);
            if (version === undefined) {
              assert.equal(err.type, FailureType.InvalidInput, bad.what);
            } else {
              assert.equal(err.type, FailureType.UnsupportedSchemaVersion, bad.what);
              assert.ok(err.message.includes(`schemaVersion ${version}`), err.message);
            }
            return true;
          },
          bad.what,
        );
      }),
      { numRuns: 1_000 },
    );
  });

  it('stays malformed over the wire, with the same fields to blame', async () => {
    fc.assert(
      fc.property(malformedInput, (bad) => {
        const wired = { ...bad, input: overTheWire(bad.input) };
        assert.throws(
          () => parseOrFail(PipelineInputSchema, wired.input, 'pipeline input'),
          (err) => {
            assert.ok(err instanceof ApplicationFailure);
            assertNamesFields(err, wired);
            return true;
          },
        );
      }),
      { numRuns: 500 },
    );
  });

  it('parseOrFail(PipelineInputSchema) accepts every valid input and fills in the default options', async () => {
    fc.assert(
      fc.property(validInput, (input) => {
        const parsed = parseOrFail(PipelineInputSchema, input, 'pipeline input');
        assert.deepEqual(parsed, { ...input, options: { ...OPTION_DEFAULTS, ...input.options } });
        assert.deepEqual(parseOrFail(PipelineInputSchema, overTheWire(input), 'pipeline input'), parsed);
      }),
      { numRuns: 1_000 },
    );
  });

  it('real runs: 30 generated ones fail at once, none stays Running, and the worker then completes a good one', async () => {
    const samples = [
      ...fc.sample(malformedInput, 24),
      ...fc.sample(
        malformedObject.filter((m) => otherVersionOf(overTheWire(m.input)) !== undefined),
        6,
      ),
    ];
    const local = await tempParts(defer);
    const taskQueue = `bad-input-${randomUUID()}`;
    const worker = await pipelineWorker(env, taskQueue, local.deps);

    const client = plainClient();
    const wallStart = Date.now();
    const result = await worker.runUntil(async () => {
      await Promise.all(
        samples.map(async (bad) => {
          const handle = await client.workflow.start<typeof documentPipeline>('documentPipeline', {
            taskQueue,
            workflowId: `bad-${randomUUID()}`,
            args: [bad.input],
          });
          const wired = overTheWire(bad.input);
          const version = otherVersionOf(wired);
          await assert.rejects(within(handle.result(), 10_000, bad.what), (err) => {
            assert.ok(err instanceof WorkflowFailedError, `${bad.what}: got ${String(err)}`);
            assert.ok(err.cause instanceof ApplicationFailure, `${bad.what}: got ${String(err.cause)}`);
            assert.equal(err.cause.nonRetryable, true, bad.what);
            if (version !== undefined) {
              assert.equal(err.cause.type, FailureType.UnsupportedSchemaVersion, bad.what);
              assert.ok(err.cause.message.includes(`schemaVersion ${version}`), err.cause.message);
              assert.match(err.cause.message, /resubmit/);
            } else {
              assertNamesFields(err.cause, { ...bad, input: wired });
            }
            return true;
          });
          const { status } = await handle.describe();
          assert.equal(status.name, 'FAILED', bad.what);
          // Failed as a workflow, not as a workflow task retried forever, and before any step was scheduled.
          const events = (await handle.fetchHistory()).events ?? [];
          assert.ok(!events.some((e) => e.workflowTaskFailedEventAttributes), `${bad.what}: a task failed`);
          assert.ok(!events.some((e) => e.activityTaskScheduledEventAttributes), `${bad.what}: a step ran`);
        }),
      );
      const wallMs = Date.now() - wallStart;
      assert.ok(wallMs < 20_000, `30 refusals took ${wallMs} ms`);
      assert.equal(await local.store.countPublications(), 0);
      assert.equal(await local.memo.count(), 0);

      const good = await pipelineInput(local.blobs, SAMPLE_TEXT);
      return client.workflow.execute<typeof documentPipeline>('documentPipeline', {
        taskQueue,
        workflowId: `good-${randomUUID()}`,
        args: [good],
      });
    });
    assert.equal(result.publication?.revision, 1);
    assert.equal(await local.store.countPublications(), 1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Documents: random bytes against an oracle written from the rules, not from the code.
// ---------------------------------------------------------------------------------------------------------------

const utf8 = (s: string): Uint8Array => new Uint8Array(Buffer.from(s, 'utf8'));
const concat = (...parts: Uint8Array[]): Uint8Array => new Uint8Array(Buffer.concat(parts));
const WHITE = [' ', '\t', '\n', '\r', '\v', '\f', '\u00a0', '\u2003', '\u2028', '\u3000', '\ufeff'];
/** Byte sequences no UTF-8 decoder may accept: stray bytes, overlongs, surrogates, beyond U+10FFFF, cut short. */
const INVALID_UTF8 = [
  [0xff],
  [0xfe],
  [0x80],
  [0xbf],
  [0xc0, 0x80],
  [0xc1, 0xbf],
  [0xe0, 0x80, 0x80],
  [0xed, 0xa0, 0x80],
  [0xf4, 0x90, 0x80, 0x80],
  [0xf8, 0x88, 0x80, 0x80, 0x80],
  [0xe2, 0x82],
  [0xf0, 0x9f, 0x98],
  [0xc3],
].map((bytes) => new Uint8Array(bytes));

const text = fc.string({ unit: 'binary', maxLength: 80 });
const documentBytes = fc.oneof(
  fc.constant(new Uint8Array(0)),
  fc.array(fc.constantFrom(...WHITE), { minLength: 1, maxLength: 12 }).map((ws) => utf8(ws.join(''))),
  text.map(utf8),
  fc.string({ unit: 'grapheme', minLength: 1, maxLength: 40 }).map((s) => utf8(`\ufeff${s}`)),
  fc.tuple(text, text).map(([a, b]) => concat(utf8(a), new Uint8Array([0]), utf8(b))),
  fc.tuple(text, fc.constantFrom(...INVALID_UTF8), text).map(([a, bad, b]) => concat(utf8(a), bad, utf8(b))),
  fc.tuple(text, fc.constantFrom(...INVALID_UTF8)).map(([a, bad]) => concat(utf8(a), bad)),
  fc.uint8Array({ maxLength: 64 }),
  fc.integer({ min: 1, max: 300 }).map((n) => utf8('long text '.repeat(n))),
);

type Expected = { ok: true; text: string } | { ok: false; mustSay: RegExp[] };

/** The rules in order of precedence: empty, too big, NUL, not UTF-8, only white space; else the text. */
function oracle(bytes: Uint8Array, maxBytes: number): Expected {
  const buffer = Buffer.from(bytes);
  if (buffer.length === 0) return { ok: false, mustSay: [/empty/, /give it some text/] };
  if (buffer.length > maxBytes) {
    return {
      ok: false,
      mustSay: [
        new RegExp(`${buffer.length} bytes`),
        new RegExp(`${maxBytes}-byte limit`),
        /MAX_DOCUMENT_BYTES/,
      ],
    };
  }
  const nul = buffer.indexOf(0);
  if (nul !== -1)
    return { ok: false, mustSay: [new RegExp(`NUL byte at offset ${nul}\\b`), /UTF-8 text file/] };
  if (!isUtf8(buffer)) return { ok: false, mustSay: [/not valid UTF-8/, /convert it/] };
  const decoded = buffer.toString('utf8').replace(/^\ufeff/, '');
  if (/^\s*$/.test(decoded)) return { ok: false, mustSay: [/only white space/, /give it some text/] };
  return { ok: true, text: decoded };
}

describe('decodeDocument', () => {
  it('matches the rules on 2,000 generated byte arrays, and every refusal says what to fix', async () => {
    const seen = { ok: 0, rejected: 0 };
    fc.assert(
      fc.property(documentBytes, fc.integer({ min: 1, max: 200 }), (bytes, maxBytes) => {
        const expected = oracle(bytes, maxBytes);
        const actual = decodeDocument(bytes, maxBytes);
        const context = `bytes ${Buffer.from(bytes).toString('hex')} max ${maxBytes}: ${JSON.stringify(actual)}`;
        if (expected.ok) {
          seen.ok++;
          assert.deepEqual(actual, expected, context);
        } else {
          seen.rejected++;
          assert.equal(actual.ok, false, context);
          if (!actual.ok) for (const phrase of expected.mustSay) assert.match(actual.reason, phrase, context);
        }
      }),
      { numRuns: 2_000 },
    );
    assert.ok(seen.ok > 100 && seen.rejected > 100, `one-sided sample: ${JSON.stringify(seen)}`);
  });

  it('collectDocuments refuses a 2 GiB file by its size, without reading it', async () => {
    const dir = scratchDir(defer, 'bad-input-huge-');
    const huge = path.join(dir, 'huge.md');
    // Sparse: no disk space used. Reading it whole would fail, as Node reads at most 2 GiB into one buffer.
    fs.writeFileSync(huge, '');
    fs.truncateSync(huge, 2 ** 31 + 10);
    fs.writeFileSync(path.join(dir, 'small.md'), '# Small\n\nFine.\n');
    const { documents, rejected } = collectDocuments([dir], 1_000);
    assert.deepEqual(
      documents.map((d) => d.source),
      [path.join(dir, 'small.md')],
    );
    assert.deepEqual(rejected, [
      {
        source: huge,
        reason: `the file is ${2 ** 31 + 10} bytes, over the 1000-byte limit; split it or raise MAX_DOCUMENT_BYTES`,
      },
    ]);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// The batch runner: every bad document listed with its reason; fixed ones processed on the rerun, done ones not.
// ---------------------------------------------------------------------------------------------------------------

describe('processDocuments with good and bad documents', () => {
  it('publishes the good ones, lists each bad one with its reason, and after the fix processes only those', async () => {
    const root = scratchDir(defer, 'bad-input-batch-');
    const dataDir = path.join(root, 'data');
    const docs = path.join(root, 'docs');
    const emptyFolder = path.join(root, 'empty-folder');
    const missingFile = path.join(root, 'missing.md');
    fs.mkdirSync(docs);
    fs.mkdirSync(emptyFolder);
    fs.writeFileSync(path.join(emptyFolder, 'picture.png'), Buffer.from([0x89, 0x50, 0x4e, 0x47]));
    const MAX = 2_000;
    const unique = randomUUID();
    const file = (name: string) => path.join(docs, name);
    const goodText = (n: number) => `# Good ${n} ${unique}\n\n${SAMPLE_TEXT}\n`;
    fs.writeFileSync(file('good-1.md'), goodText(1));
    fs.writeFileSync(file('good-2.md'), goodText(2));
    fs.writeFileSync(file('empty.md'), '');
    fs.writeFileSync(
      file('nul.md'),
      Buffer.concat([Buffer.from('# Binary\n\nbefore'), Buffer.from([0]), Buffer.from('after')]),
    );
    fs.writeFileSync(
      file('latin1.txt'),
      Buffer.from('# Caf\xe9 cr\xe8me\n\nIt was written in Latin-1.', 'latin1'),
    );
    fs.writeFileSync(file('big.md'), `# Big\n\n${'far too long. '.repeat(200)}`);
    // Inside the folder given (a link out of it is refused), under a name that is not itself a document.
    const linkTarget = path.join(docs, 'moved-away.bak');
    fs.symlinkSync(linkTarget, file('gone.md'));
    const bad: Record<string, RegExp> = {
      [file('empty.md')]: /the file is empty; give it some text/,
      [file('nul.md')]: /NUL byte at offset 16: it looks binary; give a UTF-8 text file/,
      [file('latin1.txt')]: /not valid UTF-8; convert it/,
      [file('big.md')]: /over the 2000-byte limit; split it or raise MAX_DOCUMENT_BYTES/,
      [file('gone.md')]: /cannot be read \(ENOENT\); check the file or its link target/,
      [missingFile]: /no such file or folder; check the path/,
      [emptyFolder]: /the folder holds no \.md, \.markdown, \.txt files/,
    };
    const args = [docs, missingFile, emptyFolder];

    const config = loadConfig(
      {
        DATA_DIR: dataDir,
        TEMPORAL_TASK_QUEUE: `batch-${randomUUID()}`,
        MAX_DOCUMENT_BYTES: String(MAX),
      },
      root,
    );
    assert.equal(config.dataDir, dataDir);
    const local = await tempParts(defer, { dir: dataDir, maxDocumentBytes: MAX });
    assert.equal(dataPaths(config.dataDir).blobs, path.join(local.dir, 'blobs'));

    /** One pass of the batch command with a fresh worker (a worker runs once) on the same data folder. */
    const run = async (): Promise<{
      outcomes: Awaited<ReturnType<typeof processDocuments>>['outcomes'];
      lines: string[];
    }> => {
      const worker = await createPipelineWorker({
        connection: env.nativeConnection,
        namespace: env.namespace ?? 'default',
        taskQueue: config.taskQueue,
        deps: local.deps,
        workflowBundle: await workflowBundle(),
      });
      const lines: string[] = [];
      const { outcomes } = await worker.runUntil(
        processDocuments(plainClient(), config, local.blobs, args, { print: (line) => lines.push(line) }),
      );
      return { outcomes, lines };
    };
    const idOf = (name: string) => documentIdOf(file(name));

    // First pass: two published, seven listed as failed with what to fix.
    const first = await run();
    const bySource = new Map(first.outcomes.map((o) => [o.source, o]));
    assert.equal(first.outcomes.length, 9, first.lines.join('\n'));
    for (const name of ['good-1.md', 'good-2.md']) {
      const outcome = bySource.get(file(name));
      assert.equal(outcome?.error, undefined, first.lines.join('\n'));
      assert.equal(outcome?.result?.publication?.revision, 1);
      assert.equal(outcome?.workflowId, workflowIdFor(idOf(name)));
      assert.ok(
        first.lines.includes(`${file(name)} -> ${workflowIdFor(idOf(name))} (started)`),
        first.lines.join('\n'),
      );
    }
    for (const [source, reason] of Object.entries(bad)) {
      const outcome = bySource.get(source);
      assert.ok(outcome !== undefined, `${source} is not in the outcomes`);
      assert.equal(outcome.result, undefined);
      assert.match(outcome.error ?? '', reason);
      const printed = first.lines.find((l) => l.startsWith(`FAILED ${source}: `));
      assert.ok(
        printed !== undefined && reason.test(printed),
        `no FAILED line for ${source}:\n${first.lines.join('\n')}`,
      );
    }
    assert.ok(
      first.lines.some((l) => l.includes('2 of 9 document(s) published, 7 failed.')),
      first.lines.join('\n'),
    );
    // The client stored the texts where the worker reads them: DATA_DIR/blobs, as dataPaths says.
    for (const name of ['good-1.md', 'good-2.md']) {
      const bytes = fs.readFileSync(file(name));
      const hex = createHash('sha256').update(bytes).digest('hex');
      assert.ok(
        fs.existsSync(path.join(dataDir, 'blobs', hex.slice(0, 2), hex)),
        `${name} is not in DATA_DIR/blobs`,
      );
      assert.deepEqual(await local.blobs.get(`sha256:${hex}`), bytes);
    }
    assert.equal(await local.store.countPublications(), 2);
    assert.equal(await local.memo.count(), 4);
    const firstKeys = new Map(
      await Promise.all(
        ['good-1.md', 'good-2.md'].map(
          async (name) => [name, await local.store.revisionsOf(idOf(name))] as const,
        ),
      ),
    );

    // Fix every bad input, then run the same command again.
    fs.writeFileSync(file('empty.md'), `# Was empty ${unique}\n\nNow it has text.\n`);
    fs.writeFileSync(file('nul.md'), `# Was binary ${unique}\n\nNo NUL byte any more.\n`);
    fs.writeFileSync(file('latin1.txt'), `# Café crème ${unique}\n\nNow it is UTF-8.\n`);
    fs.writeFileSync(file('big.md'), `# Was big ${unique}\n\nShort now.\n`);
    fs.writeFileSync(missingFile, `# Was missing ${unique}\n\nHere now.\n`);
    fs.writeFileSync(linkTarget, `# Was a dangling link ${unique}\n\nIts target is back.\n`);
    fs.writeFileSync(path.join(emptyFolder, 'note.md'), `# Was an empty folder ${unique}\n\nOne note.\n`);

    const second = await run();
    const log = second.lines.join('\n');
    assert.equal(second.outcomes.length, 9, log);
    assert.ok(
      second.outcomes.every((o) => o.error === undefined && o.result !== undefined),
      log,
    );
    assert.ok(log.includes('9 of 9 document(s) published, 0 failed.'), log);
    for (const name of ['good-1.md', 'good-2.md']) {
      assert.ok(
        second.lines.includes(`${file(name)} -> ${workflowIdFor(idOf(name))} (already done earlier)`),
        log,
      );
      assert.deepEqual(
        await local.store.revisionsOf(idOf(name)),
        firstKeys.get(name),
        `${name} was published again`,
      );
    }
    const fixed = [
      file('empty.md'),
      file('nul.md'),
      file('latin1.txt'),
      file('big.md'),
      file('gone.md'),
      missingFile,
    ];
    fixed.push(path.join(emptyFolder, 'note.md'));
    for (const source of fixed) {
      const documentId = documentIdOf(source);
      assert.ok(
        second.lines.includes(`${source} -> ${workflowIdFor(documentId)} (started)`),
        `${source}\n${log}`,
      );
      assert.equal((await local.store.revisionsOf(documentId)).length, 1, source);
    }
    assert.equal(second.lines.filter((l) => l.endsWith('(started)')).length, 7, log);
    assert.equal(await local.store.countPublications(), 9);
    assert.equal((await local.store.deliveries()).length, 9, 'a completed document was delivered again');
    assert.equal(await local.memo.count(), 18, 'a completed document was sent to the model again');
  });
});
