/**
 * Builders the wire schemas share. TypeBox's own builders cover most of the contract; these
 * keep the JSON Schema spellings docs/openapi.json has always used (`"type": ["string", "null"]`,
 * `oneOf` with `null`, a `$ref` to a component), so the generated file and the SDK types made
 * from it read as before, while `Static<>` still gives the right TypeScript type.
 */
import Type, { type Static, type TSchema, type TUnsafe } from 'typebox';

/** A schema that is also a component of docs/openapi.json: its `$id` is the component name. */
export type Component = TSchema;

/** The component name of a schema made with an `$id`. */
export function idOf(component: Component): string {
  const id = (component as { $id?: unknown }).$id;
  if (typeof id !== 'string') throw new Error('a wire component needs an $id');
  return id;
}

/** `schema` or null, spelled `"type": [T, "null"]` (the schema must have one `type`). */
export function nullable<T extends TSchema>(schema: T): TUnsafe<Static<T> | null> {
  const plain = { ...(schema as Record<string, unknown>) };
  return Type.Unsafe<Static<T> | null>({ ...plain, type: [plain.type, 'null'] } as TSchema);
}

/** `schema` or null, spelled `oneOf` (for a `$ref` or where the file always said so). */
export function orNull<T extends TSchema>(
  schema: T,
  options: { description?: string } = {},
): TUnsafe<Static<T> | null> {
  return Type.Unsafe<Static<T> | null>({ oneOf: [schema, { type: 'null' }], ...options });
}

/**
 * A reference to another component, typed as that component. The generator turns `$ref: Name`
 * into `#/components/schemas/Name`; checkers are given every component by name (wire/index.ts).
 */
export function ref<T extends Component>(
  component: T,
  options: { description?: string } = {},
): TUnsafe<Static<T>> {
  return Type.Unsafe<Static<T>>({ $ref: idOf(component), ...options });
}

/** A string from a fixed list, spelled `{"type": "string", "enum": [...]}`. */
export function stringEnum<const V extends readonly string[]>(
  values: V,
  options: Record<string, unknown> = {},
): TUnsafe<V[number]> {
  return Type.Unsafe<V[number]>({ type: 'string', enum: [...values], ...options });
}

/** Like stringEnum, null allowed: `{"type": ["string", "null"], "enum": [..., null]}`. */
export function nullableEnum<const V extends readonly string[]>(
  values: V,
  options: Record<string, unknown> = {},
): TUnsafe<V[number] | null> {
  return Type.Unsafe<V[number] | null>({
    type: ['string', 'null'],
    enum: [...values, null],
    ...options,
  });
}

/** An object of string values (labels, environments); `extra` adds bounds. */
export function stringMap(extra: Record<string, unknown> = {}): TUnsafe<Record<string, string>> {
  return Type.Unsafe<Record<string, string>>({
    type: 'object',
    additionalProperties: { type: 'string' },
    ...extra,
  });
}

/** `true` only when each type is assignable to the other. */
export type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;

/** `true` when what core answers fits the wire type. */
export type Fits<Core, Wire> = [Core] extends [Wire] ? true : false;

/**
 * Compile-time checks, next to a wire type that core also has: `sameAs<Wire, Core>(true)` does
 * not compile once the two payloads differ, so neither can drift without the other.
 */
export function sameAs<Wire, Core>(_: Same<Wire, Core>): void {}

/** Like sameAs, where the wire type is looser than core's (open objects, a wider union). */
export function fits<Core, Wire>(_: Fits<Core, Wire>): void {}

/** What each pattern of the wire schemas accepts, in words, for the messages of check.ts. */
export const PATTERN_WORDS = new Map<string, string>();

/** `regex` as a schema's `pattern`, with the words a rejection message uses for it. */
export function pattern(regex: string, words: string): string {
  PATTERN_WORDS.set(regex, words);
  return regex;
}

/** An absolute guest path (the guest checks the rest). */
export const ABSOLUTE_PATH = pattern('^/[^\\u0000]*$', 'an absolute path');
/** A string a shell can carry: no NUL byte. */
export const NO_NUL = pattern('^[^\\u0000]*$', 'a string without NUL');
