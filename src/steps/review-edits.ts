/**
 * What a reviewer may edit, from the step definitions: each model step's `fields` schema is the rule for its fields,
 * so an edit is held to what the step itself may return (and a changed rule changes what an edit may be). The
 * client side (the review page, `npm run review`) checks here, before it sends the decision; the run's own
 * validator (src/contract/review.ts) cannot read the steps, and checks what it can from the draft alone.
 */
import { z } from 'zod';
import type { JsonValue } from '../contract';
import { describeIssues } from '../contract';
import type { AnyModelStep } from './define';

/** The edited fields as the steps' schemas give them back, or why the edit breaks a step's rules. */
export type CheckedEdit = { ok: true; fields: Record<string, JsonValue> } | { ok: false; problem: string };

/**
 * Checks `edits` (the changed fields only) against the steps that own them: each step's schema reads the draft's
 * fields with the edits laid over them. A field no step owns is refused, as is a field the draft does not hold.
 */
export function checkEdit(
  steps: readonly AnyModelStep[],
  drafted: Record<string, JsonValue>,
  edits: Record<string, JsonValue>,
): CheckedEdit {
  const names = Object.keys(edits);
  if (names.length === 0)
    return { ok: false, problem: 'nothing was changed (approve publishes the draft as it is)' };
  const stranger = names.find((name) => !Object.hasOwn(drafted, name));
  if (stranger !== undefined)
    return {
      ok: false,
      problem: `"${stranger}" is not a field of this draft; its fields are ${Object.keys(drafted).join(', ')}`,
    };
  const merged = { ...drafted, ...edits };
  const fields: Record<string, JsonValue> = {};
  const problems: string[] = [];
  for (const step of steps) {
    const owned = names.filter((name) => ownedBy(step, name));
    if (owned.length === 0) continue;
    const parsed = (step.fields as z.ZodType<Record<string, JsonValue>>).safeParse(merged);
    if (!parsed.success) problems.push(`${step.name}'s rules: ${describeIssues(parsed.error)}`);
    else for (const name of owned) fields[name] = parsed.data[name] as JsonValue;
  }
  const unowned = names.filter((name) => !steps.some((step) => ownedBy(step, name)));
  if (unowned.length > 0) problems.push(`no step defines ${unowned.map((n) => `"${n}"`).join(', ')}`);
  return problems.length > 0 ? { ok: false, problem: problems.join('; ') } : { ok: true, fields };
}

/** What the page can say of a field's rules before the reviewer sends it (from the schema's JSON Schema). */
export interface FieldLimits {
  /** A text's longest, or a list item's. */
  maxLength?: number;
  /** A list's most items. */
  maxItems?: number;
}

/** A field's limits as its step's schema states them (refinements, which JSON Schema cannot say, are left out). */
export function fieldLimits(steps: readonly AnyModelStep[], name: string): FieldLimits {
  const step = steps.find((s) => ownedBy(s, name));
  if (step === undefined) return {};
  let schema: unknown;
  try {
    schema = z.toJSONSchema(step.fields, { unrepresentable: 'any', io: 'input' });
  } catch {
    return {};
  }
  const field = (schema as { properties?: Record<string, JsonSchemaField> }).properties?.[name];
  const text = field?.type === 'array' ? field.items : field;
  return {
    ...(typeof text?.maxLength === 'number' ? { maxLength: text.maxLength } : {}),
    ...(typeof field?.maxItems === 'number' ? { maxItems: field.maxItems } : {}),
  };
}

interface JsonSchemaField {
  type?: string;
  maxLength?: number;
  maxItems?: number;
  items?: JsonSchemaField;
}

/** True when `step`'s result holds the field `name` (its schema is an object with that key). */
function ownedBy(step: AnyModelStep, name: string): boolean {
  const shape = (step.fields as { shape?: unknown }).shape;
  return typeof shape === 'object' && shape !== null && Object.hasOwn(shape, name);
}
