/**
 * Writes the SDKs' payload types from docs/openapi.json's `components.schemas`, so that the
 * server's description of the wire and the types SDK users see cannot drift apart (issue 28):
 *
 *   npm run gen:sdk-types              # writes both files
 *   npm run gen:sdk-types -- --check   # exits 1, naming the stale files, when either is not current
 *
 * - sdk/typescript/src/wire.gen.ts, by openapi-typescript, formatted by the repository's prettier
 *   settings; sdk/typescript/src/types.ts aliases its components under the SDK's names.
 * - sdk/python/hostd/_wire_gen.py, TypedDicts written here (Python 3.9, the SDK's oldest: no
 *   NotRequired, so a payload with optional keys is a required base plus a `total=False` class);
 *   sdk/python/hostd/_types.py subclasses them under the SDK's names and docstrings.
 *
 * scripts/test.sh's lint step runs the check; test/unit/wire-drift.test.ts runs it too, and
 * checks that the SDKs' hand-written code types server answers with the generated types.
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import openapiTS, { astToString } from 'openapi-typescript';
import type { OpenAPI3 } from 'openapi-typescript';
import * as prettier from 'prettier';
import { staleFiles as staleOf, writeOrCheck } from './generated-files.js';

/** The repository: this file runs from dist/scripts/. */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const TS_OUT = 'sdk/typescript/src/wire.gen.ts';
export const PY_OUT = 'sdk/python/hostd/_wire_gen.py';
const REGENERATE = 'npm run gen:sdk-types';

/** The SDK whose types a file is. */
export type Sdk = 'typescript' | 'python';

const BOTH: Sdk[] = ['typescript', 'python'];

/**
 * Fields hostd always sends today that an SDK has typed as possibly absent since they were added
 * (`?` in TypeScript, the `total=False` part in Python), per SDK. They stay optional in that
 * SDK's types, so that user code that builds these objects (fakes, fixtures) still type-checks
 * and the SDK still types what an older hostd answers. Python's SnapshotInfo has always had a
 * required `name`, TypeScript's an optional one.
 */
export const SDK_OPTIONAL: Record<string, Record<string, Sdk[]>> = {
  SandboxInfo: {
    snapshot_id: BOTH,
    error: BOTH,
    network: BOTH,
    memory_mib: BOTH,
    merged_from: BOTH,
    metadata: BOTH,
    timeout: BOTH,
    on_timeout: BOTH,
    expires_at: BOTH,
    paused_by: BOTH,
  },
  Snapshot: { name: ['typescript'] },
};

export interface Schema {
  type?: string | string[];
  $ref?: string;
  title?: string;
  description?: string;
  enum?: unknown[];
  const?: unknown;
  anyOf?: Schema[];
  oneOf?: Schema[];
  items?: Schema;
  properties?: Record<string, Schema>;
  required?: string[];
  additionalProperties?: boolean | Schema;
}

/** docs/openapi.json's schemas as an SDK sees them: its SDK_OPTIONAL fields not required. */
export function sdkSchemas(openapiText: string, sdk: Sdk): Record<string, Schema> {
  const doc = JSON.parse(openapiText) as { components: { schemas: Record<string, Schema> } };
  const schemas = structuredClone(doc.components.schemas);
  for (const [name, fields] of Object.entries(SDK_OPTIONAL)) {
    const s = schemas[name];
    if (!s?.properties) throw new Error(`SDK_OPTIONAL names ${name}, not an object schema`);
    for (const f of Object.keys(fields)) {
      if (!s.properties[f]) throw new Error(`SDK_OPTIONAL names ${name}.${f}, not a field`);
    }
    s.required = (s.required ?? []).filter((f) => !fields[f]?.includes(sdk));
  }
  return schemas;
}

function header(comment: string): string {
  return [
    `${comment} Generated from docs/openapi.json (components.schemas) by scripts/gen-sdk-types.ts: do not edit.`,
    `${comment} Regenerate with \`${REGENERATE}\`; \`${REGENERATE} -- --check\` (CI) fails when stale.`,
  ].join('\n');
}

/** The TypeScript SDK's file: openapi-typescript's `components`, nothing of the paths. */
export async function renderTypeScript(schemas: Record<string, Schema>): Promise<string> {
  const doc = {
    openapi: '3.1.0',
    info: { title: 'hostd', version: '0' },
    paths: {},
    components: { schemas },
  } as unknown as OpenAPI3;
  const body = astToString(
    await openapiTS(doc, {
      alphabetize: false,
      // A field with a default may be absent in a request, as in the Python TypedDicts.
      defaultNonNullable: false,
      // A free-form object (a node's load) reads as unknown values, not as no fields.
      emptyObjectsUnknown: true,
    }),
  );
  const text = `${header('//')}\n// The fields SDK_OPTIONAL (there) names for TypeScript are optional here.\n\n${body}`;
  const config = (await prettier.resolveConfig(join(ROOT, TS_OUT))) ?? {};
  return prettier.format(text, { ...config, filepath: join(ROOT, TS_OUT) });
}

const PY_SCALARS: Record<string, string> = {
  string: 'str',
  integer: 'int',
  number: 'float',
  boolean: 'bool',
  null: 'None',
};

function pascal(s: string): string {
  return s
    .split(/[^A-Za-z0-9]+/)
    .filter(Boolean)
    .map((w) => w[0]!.toUpperCase() + w.slice(1))
    .join('');
}

function pyLiteral(v: unknown): string {
  if (v === true) return 'True';
  if (v === false) return 'False';
  return JSON.stringify(v);
}

function isNullSchema(s: Schema): boolean {
  return (
    s.type === 'null' || (Array.isArray(s.type) && s.type.length === 1 && s.type[0] === 'null')
  );
}

/** Python's TypedDicts of the schemas: top-level ones by their names, nested ones named after
 * their place (`SandboxInfo.network` is `SandboxInfoNetwork`, an array's items `...Item`). */
class PythonWriter {
  readonly blocks: string[] = [];
  readonly aliases: string[] = [];
  readonly names = new Set<string>();

  constructor(private readonly top: Set<string>) {}

  /** The annotation of a schema; nested objects become classes named `name`. */
  annotation(s: Schema, name: string): string {
    let nullable = false;
    let base: string;
    if (s.$ref) {
      base = s.$ref.replace('#/components/schemas/', '');
      if (!this.top.has(base)) throw new Error(`unknown $ref ${s.$ref}`);
    } else if (s.const !== undefined) {
      base = `Literal[${pyLiteral(s.const)}]`;
    } else if (s.enum) {
      const values = s.enum.filter((v) => v !== null);
      nullable = values.length < s.enum.length;
      base = `Literal[${values.map(pyLiteral).join(', ')}]`;
    } else if (s.oneOf ?? s.anyOf) {
      const members = (s.oneOf ?? s.anyOf)!;
      const real = members.filter((m) => !isNullSchema(m));
      nullable = real.length < members.length;
      const parts = real.map((m, i) =>
        this.annotation(m, m.title && !this.taken(m.title) ? m.title : `${name}${i + 1}`),
      );
      base = parts.length === 1 ? parts[0]! : `Union[${parts.join(', ')}]`;
    } else {
      const types = Array.isArray(s.type) ? s.type : s.type ? [s.type] : [];
      const real = types.filter((t) => t !== 'null');
      nullable = real.length < types.length;
      const parts = real.map((t) => this.typeOf(t, s, name));
      base =
        parts.length === 0 ? 'Any' : parts.length === 1 ? parts[0]! : `Union[${parts.join(', ')}]`;
    }
    return nullable ? `Optional[${base}]` : base;
  }

  private taken(name: string): boolean {
    return this.names.has(name) || this.top.has(name);
  }

  private typeOf(t: string, s: Schema, name: string): string {
    if (t === 'array') return `List[${s.items ? this.annotation(s.items, `${name}Item`) : 'Any'}]`;
    if (t === 'object') {
      if (s.properties && Object.keys(s.properties).length > 0) {
        this.typedDict(name, s);
        return name;
      }
      const extra = s.additionalProperties;
      return `Dict[str, ${typeof extra === 'object' ? this.annotation(extra, `${name}Value`) : 'Any'}]`;
    }
    const scalar = PY_SCALARS[t];
    if (!scalar) throw new Error(`${name}: no Python type for JSON type ${t}`);
    return scalar;
  }

  /** A top-level schema: a TypedDict, or an alias of what it is. */
  component(name: string, s: Schema): void {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    if (types.includes('object') && s.properties) {
      this.typedDict(name, s);
      return;
    }
    const annotation = this.annotation(s, name);
    this.aliases.push(
      `${docComment(s.description, '#: ')}${wrapAnnotation(`${name} = `, annotation)}`,
    );
  }

  private typedDict(name: string, s: Schema): void {
    if (this.names.has(name)) throw new Error(`two Python classes named ${name}`);
    this.names.add(name);
    const required = new Set(s.required ?? []);
    const fields = Object.entries(s.properties ?? {}).map(([key, p]) => {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(key)) {
        throw new Error(`${name}.${key} is not a Python identifier`);
      }
      const line = wrapAnnotation(`    ${key}: `, this.annotation(p, name + pascal(key)));
      return { key, text: `${docComment(p.description, '    #: ')}${line}` };
    });
    const must = fields.filter((f) => required.has(f.key));
    const may = fields.filter((f) => !required.has(f.key));
    const doc = s.description ? `${docString(s.description)}\n` : '';
    let block: string;
    if (may.length === 0) {
      block = `class ${name}(TypedDict):\n${doc}${must.map((f) => f.text).join('\n')}`;
    } else if (must.length === 0) {
      block = `class ${name}(TypedDict, total=False):\n${doc}${may.map((f) => f.text).join('\n')}`;
    } else {
      block =
        `class _${name}Required(TypedDict):\n${must.map((f) => f.text).join('\n')}\n\n\n` +
        `class ${name}(_${name}Required, total=False):\n${doc}${may.map((f) => f.text).join('\n')}`;
    }
    this.blocks.push(block);
  }
}

/** Markdown backticks to reST's double ones, for Python docstrings and comments. */
function pyDoc(text: string): string {
  return text
    .replace(/`([^`]+)`/g, '``$1``')
    .replace(/\\/g, '\\\\')
    .replace(/"""/g, '\\"\\"\\"');
}

/** A class docstring, wrapped as black would leave it. */
function docString(text: string): string {
  // Wrapped as if every line had the opening quotes' width.
  const lines = docComment(text, '       ')
    .split('\n')
    .filter(Boolean)
    .map((l) => `    ${l.trimStart()}`);
  lines[0] = `    """${lines[0]!.trimStart()}`;
  lines[lines.length - 1] += '"""';
  return `${lines.join('\n')}\n`;
}

/** `start + annotation`, its outer brackets' items one per line when it is over 100 columns. */
function wrapAnnotation(start: string, annotation: string): string {
  const open = annotation.indexOf('[');
  if (start.length + annotation.length <= 100 || open < 0) return start + annotation;
  const items: string[] = [];
  let depth = 0;
  let from = open + 1;
  for (let i = from; i < annotation.length - 1; i++) {
    const c = annotation[i];
    if (c === '[') depth++;
    else if (c === ']') depth--;
    else if (c === ',' && depth === 0) {
      items.push(annotation.slice(from, i).trim());
      from = i + 1;
    }
  }
  items.push(annotation.slice(from, annotation.length - 1).trim());
  const indent = start.length - start.trimStart().length;
  const inner = ' '.repeat(indent + 4);
  return (
    `${start}${annotation.slice(0, open + 1)}\n` +
    items.map((item) => `${inner}${item},\n`).join('') +
    `${' '.repeat(indent)}]`
  );
}

function docComment(text: string | undefined, prefix: string): string {
  if (!text) return '';
  const words = pyDoc(text).split(/\s+/);
  const lines: string[] = [];
  let line = '';
  for (const w of words) {
    if (line && prefix.length + line.length + 1 + w.length > 100) {
      lines.push(line);
      line = w;
    } else {
      line = line ? `${line} ${w}` : w;
    }
  }
  if (line) lines.push(line);
  return lines.map((l) => `${prefix}${l}\n`).join('');
}

/** The Python SDK's file. */
export function renderPython(schemas: Record<string, Schema>): string {
  const w = new PythonWriter(new Set(Object.keys(schemas)));
  for (const [name, s] of Object.entries(schemas)) w.component(name, s);
  return [
    header('#'),
    '# The fields SDK_OPTIONAL (there) names for Python are in the total=False part.',
    '"""The payloads of the hostd HTTP API as docs/openapi.json describes them. Import them from',
    '``hostd`` (hostd/_types.py), which names them as the SDK does."""',
    '',
    'from __future__ import annotations',
    '',
    'from typing import Any, Dict, List, Literal, Optional, TypedDict, Union',
    '',
    '',
    [...w.blocks, ...w.aliases].join('\n\n\n'),
    '',
  ].join('\n');
}

/** Both files' paths and wanted contents. */
export async function render(): Promise<Array<{ path: string; text: string }>> {
  const openapi = readFileSync(join(ROOT, 'docs', 'openapi.json'), 'utf8');
  return [
    { path: TS_OUT, text: await renderTypeScript(sdkSchemas(openapi, 'typescript')) },
    { path: PY_OUT, text: renderPython(sdkSchemas(openapi, 'python')) },
  ];
}

/** The generated files that differ from what docs/openapi.json gives (none when current). */
export async function staleFiles(): Promise<string[]> {
  return staleOf(ROOT, await render());
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1])
  writeOrCheck(ROOT, await render(), 'gen:sdk-types', REGENERATE);
