/**
 * Every answer of the route tests checked against the wire contract: the schema docs/openapi.json
 * gives its route, method and status (generated from src/api/wire), an NDJSON exec stream line by
 * line against `ExecEvent`, an error against `Error`. The server does not serialise through these
 * schemas (fastify's response schemas drop the fields they do not list), so this is where an
 * answer that left the contract is caught. `checkedSchemas()` says which components were checked,
 * so a test can make sure the payloads it cares about were reached.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { TSchema } from 'typebox';
import Value from 'typebox/value';
import { ROOT } from '../../testkit/root.js';

interface Operation {
  responses?: Record<string, { content?: Record<string, { schema?: unknown }> }>;
}
const doc = JSON.parse(readFileSync(join(ROOT, 'docs', 'openapi.json'), 'utf8')) as {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, unknown> };
};

const PREFIX = '#/components/schemas/';

/** `$ref: #/components/schemas/X` as `$ref: X`, the names the checker's context has. */
function local(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(local);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(
    Object.entries(value).map(([k, v]) =>
      k === '$ref' && typeof v === 'string' && v.startsWith(PREFIX)
        ? [k, v.slice(PREFIX.length)]
        : [k, local(v)],
    ),
  );
}

const CONTEXT = local(doc.components.schemas) as Record<string, TSchema>;

/** The openapi paths as patterns, the ones with more fixed segments first. */
const PATHS = Object.keys(doc.paths)
  .map((path) => ({
    path,
    re: new RegExp(`^${path.replace(/\{[^}]+\}/g, '[^/]+')}$`),
    fixed: path.split('/').filter((p) => p !== '' && !p.startsWith('{')).length,
  }))
  .sort((a, b) => b.fixed - a.fixed);

const checked = new Set<string>();

/** The component names answers were checked against in this process. */
export function checkedSchemas(): ReadonlySet<string> {
  return checked;
}

function names(schema: unknown): string[] {
  const ref = (schema as { $ref?: unknown }).$ref;
  return typeof ref === 'string' ? [ref.replace(PREFIX, '')] : [];
}

function check(where: string, schema: unknown, value: unknown): void {
  const s = local(schema) as TSchema;
  if (!Value.Check(CONTEXT, s, value)) {
    const errors = [...Value.Errors(CONTEXT, s, value)].slice(0, 5);
    assert.fail(
      `${where}: the answer is not what docs/openapi.json says: ${JSON.stringify(errors)}\n` +
        JSON.stringify(value).slice(0, 500),
    );
  }
  for (const n of names(schema)) checked.add(n);
  // what a list or a fork answer holds counts as checked too
  const props = (CONTEXT[names(schema)[0] ?? ''] as { properties?: Record<string, unknown> })
    ?.properties;
  for (const p of Object.values(props ?? {})) {
    const items = (p as { items?: unknown }).items;
    if (items !== undefined) for (const n of names(items)) checked.add(n);
  }
}

/**
 * Checks one answer of `method url` (the URL as injected). Answers of routes the file does not
 * describe, and bodies that are not JSON or NDJSON (files, logs, metrics), are not checked.
 */
export function checkAnswer(
  method: string,
  url: string,
  res: { statusCode: number; headers: Record<string, unknown>; body: string },
): void {
  const where = `${method} ${url.slice(0, 100)} (${res.statusCode})`;
  const type = String(res.headers['content-type'] ?? '');
  if (res.statusCode >= 400 && type.startsWith('application/json')) {
    check(where, { $ref: `${PREFIX}Error` }, JSON.parse(res.body));
    return;
  }
  const path = url.split('?')[0]!;
  const found = PATHS.find((p) => p.re.test(path));
  const op = found && doc.paths[found.path]?.[method.toLowerCase()];
  const content = op?.responses?.[String(res.statusCode)]?.content;
  if (content === undefined) return;
  if (type.startsWith('application/json') && content['application/json']?.schema) {
    check(where, content['application/json'].schema, JSON.parse(res.body));
  } else if (type.startsWith('application/x-ndjson') && content['application/x-ndjson']?.schema) {
    const schema = content['application/x-ndjson'].schema;
    for (const line of res.body.split('\n').filter((l) => l !== '')) {
      check(where, schema, JSON.parse(line));
    }
  }
}
