/**
 * The run's input is complete (taken as it is, no command issued) only when PipelineInputSchema, the one
 * definition, returns it unchanged: property-based, over valid inputs and every kind of damage to them; and our
 * clients' inputs are complete.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { BatchOptionsSchema } from '../src/contract/batch';
import {
  completePipelineInput,
  INPUT_SCHEMA_VERSION,
  ModelStepFieldsSchema,
  OPTION_LIMITS,
  PipelineInputSchema,
  PipelineOptionsSchema,
} from '../src/contract';
import { isModelStepFields } from '../src/contract/plain';

const optionNames = Object.keys(OPTION_LIMITS) as (keyof typeof OPTION_LIMITS)[];

// As JSON decodes them: plain objects (fast-check would also make null-prototype ones, which JSON never decodes
// to the worker's check).
const validInput = fc.record(
  {
    schemaVersion: fc.constant(INPUT_SCHEMA_VERSION),
    documentId: fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/),
    textRef: fc.stringMatching(/^[0-9a-f]{64}$/).map((hex) => `sha256:${hex}`),
    title: fc.string({ minLength: 1, maxLength: 300 }),
    options: fc.record(
      Object.fromEntries(
        optionNames.map((name) => [
          name,
          fc.integer({ min: OPTION_LIMITS[name].min, max: OPTION_LIMITS[name].max }),
        ]),
      ) as Record<(typeof optionNames)[number], fc.Arbitrary<number>>,
      { noNullPrototype: true },
    ),
  },
  { noNullPrototype: true },
);

/** Names that trip plain-object lookups, and the input's own field names. */
const keyName = fc.oneof(
  fc.constantFrom(
    '__proto__',
    'constructor',
    'toString',
    'hasOwnProperty',
    'schemaVersion',
    'maxTags',
    'extra',
  ),
  fc.string(),
);
const oddValue = fc.oneof(
  fc.anything(),
  fc.double(),
  fc.integer({ min: -10, max: 100_000 }),
  fc.string({ maxLength: 400 }),
  fc.constant(undefined),
);

/** A valid input with one thing done to it: a field removed, replaced, or added, at the top or in the options. */
const damagedInput = fc
  .tuple(validInput, fc.nat(), keyName, oddValue, fc.boolean(), fc.constantFrom('remove', 'replace', 'add'))
  .map(([input, pick, name, value, inOptions, how]) => {
    const copy: Record<string, unknown> = { ...input, options: { ...input.options } };
    const target = (inOptions ? copy.options : copy) as Record<string, unknown>;
    const keys = Object.keys(target);
    const key = how === 'add' ? name : (keys[pick % keys.length] ?? name);
    if (how === 'remove') Reflect.deleteProperty(target, key);
    else Object.defineProperty(target, key, { value, enumerable: true, configurable: true, writable: true });
    return copy;
  });

describe('completePipelineInput', () => {
  it('takes an input as it is only when the schema would return it unchanged', () => {
    fc.assert(
      fc.property(fc.oneof(damagedInput, validInput, fc.anything()), (input) => {
        const complete = completePipelineInput(input);
        const parsed = PipelineInputSchema.safeParse(input);
        if (complete === undefined) {
          // Refused, or changed by the schema (a default filled in): never taken as it is.
          if (parsed.success) assert.notDeepEqual(parsed.data, input, JSON.stringify(input));
          return;
        }
        assert.ok(parsed.success, JSON.stringify(input));
        assert.deepEqual(complete, input);
      }),
      { numRuns: 3_000 },
    );
  });

  it('takes every complete valid input, so runs our clients start check nothing in the worker', () => {
    fc.assert(
      fc.property(validInput, (input) => {
        assert.deepEqual(completePipelineInput(input), input, JSON.stringify(input));
      }),
      { numRuns: 1_000 },
    );
  });

  it("is what submitDocument's and the batch's inputs are", () => {
    const base = {
      schemaVersion: INPUT_SCHEMA_VERSION,
      documentId: 'notes.md',
      textRef: `sha256:${'a'.repeat(64)}`,
      title: 'Notes',
    };
    assert.ok(
      completePipelineInput({ ...base, options: PipelineOptionsSchema.parse({ stepBudgetMinutes: 5 }) }),
    );
    assert.ok(completePipelineInput({ ...base, options: BatchOptionsSchema.parse({}).pipeline }));
    const agent = {
      maxTurns: 8,
      maxTokens: 20_000,
      historyEvents: 2_000,
      corpusRef: `sha256:${'b'.repeat(64)}`,
    };
    assert.ok(completePipelineInput({ ...base, options: BatchOptionsSchema.parse({}).pipeline, agent }));
    // A partial input (the Temporal CLI, an older client) is filled in by the schema in the run instead.
    assert.equal(completePipelineInput({ ...base, options: { maxTags: 5 } }), undefined);
    assert.equal(completePipelineInput(base), undefined);
  });
});

describe('isModelStepFields', () => {
  const usage = fc.record({ inputTokens: fc.integer({ min: -2, max: 1e6 }), outputTokens: fc.nat() });
  const fields = fc.record(
    {
      idempotencyKey: fc.oneof(fc.string(), fc.integer()),
      model: fc.record({ provider: fc.string({ maxLength: 3 }), model: fc.string() }),
      usage: fc.oneof(usage, fc.anything()),
      memoised: fc.oneof(fc.boolean(), fc.anything()),
      estimatedCostUsd: fc.oneof(fc.double(), fc.constant(null), fc.anything()),
      rejectedUsage: fc.oneof(usage, fc.anything()),
      summary: fc.string(),
    },
    { requiredKeys: ['idempotencyKey', 'model', 'usage'] },
  );
  it('says of a value what ModelStepFieldsSchema says (the batch sums model steps with it in the sandbox)', () => {
    fc.assert(
      fc.property(fc.oneof(fields, fc.anything()), (value) => {
        assert.equal(isModelStepFields(value), ModelStepFieldsSchema.safeParse(value).success);
      }),
      { numRuns: 2_000 },
    );
  });
});
