/**
 * The payloads hostd answers with are written out three times: docs/openapi.json, the
 * TypeScript SDK's types (sdk/typescript/src/types.ts) and the Python SDK's TypedDicts
 * (sdk/python/hostd/_types.py). Until they are generated from one definition (issue 28), this
 * test holds them together: the same fields, and a field is nullable in all three or in none
 * (the drift it was written for: `image_key`, nullable in core and the OpenAPI file, a plain
 * string in both SDKs). Whether an SDK marks an always-present field optional is its own choice.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { ROOT } from '../../testkit/hostd.js';

/** A payload's fields: name -> nullable. */
type Fields = Record<string, boolean>;

/** OpenAPI schema name -> [TypeScript interface, Python TypedDict] of the same payload. */
const PAYLOADS: Record<string, [string, string]> = {
  SandboxInfo: ['SandboxInfo', 'SandboxInfo'],
  Snapshot: ['SnapshotInfo', 'SnapshotInfo'],
  Template: ['TemplateInfo', 'TemplateInfo'],
  FileEntry: ['EntryInfo', 'EntryInfo'],
  Context: ['ContextInfo', 'ContextInfo'],
};

/**
 * Fields one side has on purpose. `node` is only answered in cluster mode (docs/cluster.md),
 * which the SDKs do not model yet.
 */
const ONLY_IN_OPENAPI: Record<string, string[]> = { SandboxInfo: ['node'] };

interface Schema {
  type?: string | string[];
  $ref?: string;
  anyOf?: Schema[];
  oneOf?: Schema[];
  properties?: Record<string, Schema>;
}

const openapi = JSON.parse(readFileSync(join(ROOT, 'docs', 'openapi.json'), 'utf8')) as {
  components: { schemas: Record<string, Schema> };
};

function schemaNullable(s: Schema): boolean {
  if (Array.isArray(s.type)) return s.type.includes('null');
  if (s.type === 'null') return true;
  return [...(s.anyOf ?? []), ...(s.oneOf ?? [])].some(schemaNullable);
}

function openapiFields(name: string): Fields {
  const schema = openapi.components.schemas[name];
  assert.ok(schema?.properties, `docs/openapi.json has the schema ${name}`);
  return Object.fromEntries(
    Object.entries(schema.properties).map(([k, s]) => [k, schemaNullable(s)]),
  );
}

const tsSource = ts.createSourceFile(
  'types.ts',
  readFileSync(join(ROOT, 'sdk', 'typescript', 'src', 'types.ts'), 'utf8'),
  ts.ScriptTarget.Latest,
);

function tsNullable(type: ts.TypeNode | undefined): boolean {
  if (!type) return false;
  if (ts.isLiteralTypeNode(type)) return type.literal.kind === ts.SyntaxKind.NullKeyword;
  return ts.isUnionTypeNode(type) && type.types.some(tsNullable);
}

function tsFields(name: string): Fields {
  const decl = tsSource.statements.find(
    (s): s is ts.InterfaceDeclaration => ts.isInterfaceDeclaration(s) && s.name.text === name,
  );
  assert.ok(decl, `sdk/typescript/src/types.ts has the interface ${name}`);
  const fields: Fields = {};
  for (const m of decl.members) {
    if (ts.isPropertySignature(m) && m.name && ts.isIdentifier(m.name)) {
      fields[m.name.text] = tsNullable(m.type);
    }
  }
  return fields;
}

/** Every TypedDict of the Python SDK with its fields (its bases' included), read by Python's ast. */
const pyTypes = ((): Record<string, Fields> => {
  const script = `
import ast, json, sys
tree = ast.parse(open(sys.argv[1]).read())
classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
def fields(name):
    c = classes[name]
    out = {}
    for b in c.bases:
        if isinstance(b, ast.Name) and b.id in classes:
            out.update(fields(b.id))
    for st in c.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            out[st.target.id] = ast.unparse(st.annotation).startswith('Optional[')
    return out
print(json.dumps({n: fields(n) for n in classes}))
`;
  const r = spawnSync(
    'python3',
    ['-c', script, join(ROOT, 'sdk', 'python', 'hostd', '_types.py')],
    {
      encoding: 'utf8',
    },
  );
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Record<string, Fields>;
})();

for (const [schema, [tsName, pyName]] of Object.entries(PAYLOADS)) {
  test(`${schema}: the same fields, nullable alike, in the OpenAPI file and both SDKs`, () => {
    const expected = openapiFields(schema);
    for (const k of ONLY_IN_OPENAPI[schema] ?? []) delete expected[k];
    assert.deepEqual(tsFields(tsName), expected, `sdk/typescript ${tsName}`);
    assert.ok(pyTypes[pyName], `sdk/python has the TypedDict ${pyName}`);
    assert.deepEqual(pyTypes[pyName], expected, `sdk/python ${pyName}`);
  });
}
