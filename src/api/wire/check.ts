/**
 * Request bodies checked against their wire schema, each failure a registry error a person can
 * act on: the same `invalid_request` entries the hand-written validators used (`bodyNotObject`,
 * `unknownField`, `invalidField`), naming the field (`env.A`, `network.allow_out`, `env name`),
 * what the schema accepts (from its keywords: "an integer from 1 to 32") and what was sent
 * (shown by the registry's `show`, so a huge or deep value stays a short message).
 */
import type { Static, TSchema } from 'typebox';
import { Compile } from 'typebox/compile';
import { fail } from '../../errors.js';
import { PATTERN_WORDS } from './schema.js';

type Validator = ReturnType<typeof Compile>;
const compiled = new WeakMap<TSchema, Validator>();

function validator(schema: TSchema): Validator {
  let v = compiled.get(schema);
  if (v === undefined) {
    v = Compile(schema);
    compiled.set(schema, v);
  }
  return v;
}

/**
 * Compiles `schema`'s check now rather than at the first body it checks: for the routes whose
 * first request should not pay it (a create's: 2.6 ms on a quiet host, ~6 ms under load here,
 * docs/architecture.md, "A pool hit's create, session 11").
 */
export function compileAhead(schema: TSchema): void {
  validator(schema);
}

/** Whether `schema`'s check is compiled already (tests). */
export function isCompiled(schema: TSchema): boolean {
  return compiled.has(schema);
}

interface SchemaError {
  keyword: string;
  schemaPath: string;
  instancePath: string;
  params: Record<string, unknown>;
}

type Json = Record<string, unknown>;

/** The value a JSON pointer (`#/properties/n`, `/env/A`) names, or undefined. */
function at(root: unknown, pointer: string): unknown {
  const parts = pointer.replace(/^#/, '').split('/').slice(1);
  let v = root;
  for (const raw of parts) {
    const key = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (v === null || typeof v !== 'object' || !Object.hasOwn(v, key)) return undefined;
    v = (v as Json)[key];
  }
  return v;
}

/** `/network/allow_out` as `network.allow_out`. */
function fieldName(instancePath: string): string {
  return instancePath
    .split('/')
    .slice(1)
    .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'))
    .join('.');
}

const ARTICLE: Record<string, string> = {
  string: 'a string',
  integer: 'an integer',
  number: 'a number',
  boolean: 'a boolean',
  object: 'an object',
  array: 'an array',
  null: 'null',
};

/** What a schema accepts, in words: "an integer from 1 to 32", "a number in (0, 86400] or null". */
export function expected(schema: unknown): string {
  if (schema === null || typeof schema !== 'object') return 'a valid value';
  const s = schema as Json;
  if (Array.isArray(s.enum)) {
    const values = s.enum.map((v) => JSON.stringify(v));
    return values.length === 1
      ? values[0]!
      : `${values.slice(0, -1).join(', ')} or ${values.at(-1)}`;
  }
  if ('const' in s) return JSON.stringify(s.const);
  const types = (Array.isArray(s.type) ? s.type : [s.type]).filter(
    (t): t is string => typeof t === 'string',
  );
  const main = types.filter((t) => t !== 'null');
  let text = main.map((t) => ARTICLE[t] ?? t).join(' or ') || 'a value';
  const num = (k: string) => (typeof s[k] === 'number' ? (s[k] as number) : undefined);
  const [min, xmin, max] = [num('minimum'), num('exclusiveMinimum'), num('maximum')];
  if (min !== undefined && max !== undefined) text += ` from ${min} to ${max}`;
  else if (xmin !== undefined && max !== undefined) text += ` in (${xmin}, ${max}]`;
  else if (min !== undefined) text += ` of at least ${min}`;
  else if (xmin !== undefined) text += ` over ${xmin}`;
  else if (max !== undefined) text += ` of at most ${max}`;
  if (s.minLength === 1 && s.maxLength === undefined) text = `a non-empty ${text.slice(2)}`;
  else if (num('maxLength') !== undefined)
    text += ` of ${num('minLength') ?? 0} to ${num('maxLength')} characters`;
  if (typeof s.pattern === 'string') {
    const words = PATTERN_WORDS.get(s.pattern);
    text = words ?? `${text} matching ${s.pattern}`;
  }
  if (s.type === 'object' || types.includes('object')) {
    const values = s.additionalProperties as Json | undefined;
    if (values && typeof values === 'object' && values.type === 'string')
      text += ' of string values';
    if (num('maxProperties') !== undefined) text += ` with at most ${num('maxProperties')} entries`;
  }
  if (num('maxItems') !== undefined) text += ` of at most ${num('maxItems')} items`;
  if (types.includes('null')) text += text.includes(',') ? ', or null' : ' or null';
  return text;
}

/** The registry error for a body's first schema failure; unknown fields are reported first. */
function toRegistryError(schema: TSchema, body: unknown, errors: SchemaError[]): Error {
  for (const e of errors) {
    const where = at(schema, e.schemaPath) as Json | undefined;
    if (e.keyword === 'additionalProperties' && where?.additionalProperties === false) {
      const extra = (e.params.additionalProperties as string[] | undefined)?.[0] ?? '';
      return fail('unknownField', extra, Object.keys((where.properties as Json) ?? {}));
    }
  }
  const skip = new Set(['boolean', 'propertyNames', 'additionalProperties']);
  const e = errors.find((err) => !skip.has(err.keyword)) ?? errors[0];
  if (e === undefined) return fail('bodyNotObject', 'the body');
  const where = at(schema, e.schemaPath);
  if (e.keyword === 'required') {
    const name = (e.params.requiredProperties as string[] | undefined)?.[0] ?? '';
    const parent = fieldName(e.instancePath);
    const property = at(where, `/properties/${name}`);
    return fail(
      'invalidField',
      parent ? `${parent}.${name}` : name,
      `${expected(property)} (required)`,
      undefined,
    );
  }
  if (e.schemaPath.endsWith('/propertyNames')) {
    const parts = e.instancePath.split('/');
    return fail(
      'invalidField',
      `${fieldName(parts.slice(0, -1).join('/'))} name`,
      expected(where),
      fieldName(`/${parts.at(-1)}`),
    );
  }
  return fail('invalidField', fieldName(e.instancePath), expected(where), at(body, e.instancePath));
}

/**
 * `body` as the schema's type, or the registry error for what is wrong with it. `missing: 'ok'`:
 * no body at all (or JSON null) is `{}`, for the routes whose every field is optional.
 */
export function checkBody<T extends TSchema>(
  schema: T,
  body: unknown,
  missing: 'ok' | 'refused',
): Static<T> {
  if (body === undefined || body === null) {
    if (missing === 'ok') return {} as Static<T>;
    throw fail('bodyNotObject', 'the body (required)');
  }
  if (typeof body !== 'object' || Array.isArray(body)) throw fail('bodyNotObject', 'the body');
  const v = validator(schema);
  if (v.Check(body)) return body as Static<T>;
  throw toRegistryError(schema, body, [...v.Errors(body)] as SchemaError[]);
}
