/** The plain value types every part of the contract speaks of, with no imports: JSON, and which model answered. */

/** Any JSON value: what a step may put into the publication. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** `offline`, or the provider part of MODEL (`openai`, `anthropic`, ...), and the model's name. */
export type ModelInfo = {
  provider: string;
  model: string;
};
