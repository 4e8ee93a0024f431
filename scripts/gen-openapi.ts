/**
 * Writes docs/openapi.json's `components.schemas` from the wire schemas (src/api/wire), so the
 * payloads are defined once: the server validates with the same schemas, and the SDK types are
 * generated from this file. The paths stay hand-written in the file and refer to components by
 * `$ref`. `--check` writes nothing and fails when the file is not what would be written (CI,
 * scripts/test.sh): a change to a schema must come with its regenerated file.
 *
 * Run: `npm run gen:openapi` (or `npm run gen:openapi -- --check`).
 */
import { readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as prettier from 'prettier';
import { COMPONENTS } from '../src/api/wire/index.js';
import { idOf } from '../src/api/wire/schema.js';
import { writeOrCheck } from './generated-files.js';

/** The repository: this file runs as dist/scripts/gen-openapi.js. */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const FILE = join(ROOT, 'docs', 'openapi.json');

/** Keys of an object schema first in this order, the way the file has always been written. */
const OBJECT_ORDER = ['title', 'type', 'description', 'properties', 'required'];

/**
 * A schema as the file spells it: plain JSON (TypeBox's own markers are not enumerable), no
 * `$id`, `$ref: Name` as `#/components/schemas/Name`, an object's keys in OBJECT_ORDER.
 */
function toOpenApi(value: unknown, top: boolean): unknown {
  if (Array.isArray(value)) return value.map((v) => toOpenApi(v, false));
  if (value === null || typeof value !== 'object') return value;
  const entries = Object.entries(value as Record<string, unknown>).filter(
    ([k]) => !(top && k === '$id'),
  );
  if ('properties' in value) {
    const rank = (k: string) => {
      const i = OBJECT_ORDER.indexOf(k);
      return i === -1 ? OBJECT_ORDER.length : i;
    };
    entries.sort(([a], [b]) => rank(a) - rank(b));
  }
  return Object.fromEntries(
    entries.map(([k, v]) => {
      if (k === '$ref' && typeof v === 'string' && !v.startsWith('#')) {
        return [k, `#/components/schemas/${v}`];
      }
      // properties and examples hold names and values, not schemas: copy them as they are
      if (k === 'examples' || k === 'enum' || k === 'const' || k === 'default') return [k, v];
      if (k === 'properties') {
        const props = Object.entries(v as Record<string, unknown>).map(([name, s]) => [
          name,
          toOpenApi(s, false),
        ]);
        return [k, Object.fromEntries(props)];
      }
      return [k, toOpenApi(v, false)];
    }),
  );
}

/**
 * The span of the JSON value that starts at `start` (an object): the index after its closing
 * brace. Strings are skipped whole, so braces inside descriptions do not count.
 */
function valueEnd(text: string, start: number): number {
  let depth = 0;
  for (let i = start; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      for (i++; text[i] !== '"'; i++) if (text[i] === '\\') i++;
    } else if (c === '{' || c === '[') {
      depth++;
    } else if (c === '}' || c === ']') {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  throw new Error('docs/openapi.json ends inside components.schemas');
}

/**
 * What docs/openapi.json should hold: the file as it is, with its `components.schemas` replaced
 * by the generated ones. Only that span of the text is replaced (a parse and re-serialisation
 * would reorder the numeric status codes of the hand-written paths).
 */
export async function generate(current: string): Promise<string> {
  const schemas = Object.fromEntries(
    COMPONENTS.map((c) => [idOf(c), toOpenApi(JSON.parse(JSON.stringify(c)), true)]),
  );
  const components = current.lastIndexOf('"components"');
  const key = current.indexOf('"schemas"', components);
  if (components === -1 || key === -1)
    throw new Error('docs/openapi.json has no components.schemas');
  const open = current.indexOf('{', key);
  const text =
    current.slice(0, open) +
    JSON.stringify(schemas, null, 2) +
    current.slice(valueEnd(current, open));
  const options = (await prettier.resolveConfig(FILE)) ?? {};
  return prettier.format(text, { ...options, filepath: FILE });
}

const current = readFileSync(FILE, 'utf8');
writeOrCheck(
  ROOT,
  [{ path: relative(ROOT, FILE), text: await generate(current) }],
  'gen:openapi',
  'npm run gen:openapi',
);
