/**
 * The payloads hostd answers with are defined once, in src/api/wire; docs/openapi.json's
 * components are generated from there (`npm run gen:openapi`), and the SDKs' payload types from
 * docs/openapi.json's components.schemas (`npm run gen:sdk-types`, scripts/gen-sdk-types.ts):
 * sdk/typescript/src/wire.gen.ts and sdk/python/hostd/_wire_gen.py. Generation makes the fields
 * and their nullability agree by construction, so this test no longer compares fields (it did
 * while the types were written three times); it holds what generation cannot: the generated
 * files are current (scripts/test.sh's lint step runs the same check with `--check`, this one
 * makes `npm run test:unit` see it too), the SDK names users import are the generated types and
 * not copies, and the SDKs' hand-written calls type what the server answers with them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { ROOT } from '../../testkit/root.js';
import { staleFiles } from '../../scripts/gen-sdk-types.js';

/**
 * The server-described payloads as the SDKs name them: the TypeScript alias must be of `tsOf`
 * (a generated component, or a part of one), the Python class must subclass `_wire.<pyOf>`.
 */
const PAYLOADS: Array<{ ts: string; tsOf: string; py?: string; pyOf?: string }> = [
  { ts: 'SandboxInfo', tsOf: "Schemas['SandboxInfo']", py: 'SandboxInfo', pyOf: 'SandboxInfo' },
  { ts: 'SandboxState', tsOf: "Schemas['SandboxInfo']['state']" },
  {
    ts: 'NetworkInfo',
    tsOf: "Schemas['SandboxInfo']['network']",
    py: 'NetworkInfo',
    pyOf: 'SandboxInfoNetwork',
  },
  {
    ts: 'MergeInfo',
    tsOf: "Schemas['SandboxInfo']['merged_from']",
    py: 'MergeInfo',
    pyOf: 'SandboxInfoMergedFromItem',
  },
  { ts: 'SnapshotInfo', tsOf: "Schemas['Snapshot']", py: 'SnapshotInfo', pyOf: 'Snapshot' },
  { ts: 'TemplateInfo', tsOf: "Schemas['Template']", py: 'TemplateInfo', pyOf: 'Template' },
  { ts: 'EntryInfo', tsOf: "Schemas['FileEntry']", py: 'EntryInfo', pyOf: 'FileEntry' },
  { ts: 'ContextInfo', tsOf: "Schemas['Context']", py: 'ContextInfo', pyOf: 'Context' },
  { ts: 'WriteInfo', tsOf: "Schemas['FileWritten']", py: 'WriteInfo', pyOf: 'FileWritten' },
  // Python's TransferInfo is written by hand (see there); checked against FileWritten below.
  { ts: 'TransferInfo', tsOf: "Schemas['FileWritten']" },
  // Python's CellError is a dataclass the SDK makes from the event.
  { ts: 'CellError', tsOf: "Schemas['CellError']" },
];

test('the generated SDK types are what docs/openapi.json gives (npm run gen:sdk-types)', async () => {
  assert.deepEqual(await staleFiles(), [], 'stale: run `npm run gen:sdk-types` and commit');
});

const TS_SRC = join(ROOT, 'sdk', 'typescript', 'src');

function parse(path: string): ts.SourceFile {
  return ts.createSourceFile(path, readFileSync(path, 'utf8'), ts.ScriptTarget.Latest, true);
}

/** A file's type aliases: name -> the aliased type's text. */
function aliases(file: ts.SourceFile): Map<string, string> {
  const out = new Map<string, string>();
  for (const s of file.statements) {
    if (ts.isTypeAliasDeclaration(s)) out.set(s.name.text, s.type.getText(file));
  }
  return out;
}

const typesFile = parse(join(TS_SRC, 'types.ts'));
const typesAliases = aliases(typesFile);

test('TypeScript: the payload names users import are aliases of the generated components', () => {
  const interfaces = typesFile.statements.filter(ts.isInterfaceDeclaration).map((s) => s.name.text);
  for (const { ts: name, tsOf } of PAYLOADS) {
    assert.ok(!interfaces.includes(name), `types.ts writes ${name} by hand`);
    const text = typesAliases.get(name);
    assert.ok(text, `types.ts has the type ${name}`);
    assert.ok(text.includes(tsOf), `types.ts's ${name} is ${text}, not of ${tsOf}`);
  }
});

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory()
      ? sources(join(dir, e.name))
      : e.name.endsWith('.ts') && !e.name.endsWith('.gen.ts')
        ? [join(dir, e.name)]
        : [],
  );
}

/**
 * Answers the OpenAPI file describes inline rather than as a component (files list, move and
 * mkdir), so there is no generated type to name them by.
 */
const INLINE = ['{ entries: EntryInfo[] }', '{ path: string }'];

test('TypeScript: every server answer the SDK parses is typed by a generated type', () => {
  // Types that come from wire.gen.ts: types.ts's aliases of it, and a file's own.
  const generated = new Set(
    [...typesAliases].filter(([, text]) => text.includes('Schemas[')).map(([n]) => n),
  );
  const checked: string[] = [];
  for (const path of sources(TS_SRC)) {
    if (path.endsWith('http.ts')) continue; // requestJson<T> itself.
    const file = parse(path);
    const local = new Set(
      [...aliases(file)].filter(([, t]) => t.includes("components['schemas']")).map(([n]) => n),
    );
    const visit = (node: ts.Node): void => {
      if (
        ts.isCallExpression(node) &&
        ts.isIdentifier(node.expression) &&
        node.expression.text === 'requestJson'
      ) {
        const arg = node.typeArguments?.[0];
        assert.ok(arg, `${path}: requestJson without a type argument`);
        const where = `${path.slice(ROOT.length + 1)}: requestJson<${arg.getText(file)}>`;
        checked.push(where);
        const refs = (n: ts.Node): void => {
          if (ts.isTypeReferenceNode(n)) {
            const name = n.typeName.getText(file);
            assert.ok(
              name === 'components' || generated.has(name) || local.has(name),
              `${where} names ${name}, which is not a generated type`,
            );
          }
          ts.forEachChild(n, refs);
        };
        refs(arg);
        const literals: string[] = [];
        const shapes = (n: ts.Node): void => {
          if (ts.isTypeLiteralNode(n)) literals.push(n.getText(file).replace(/\s+/g, ' '));
          ts.forEachChild(n, shapes);
        };
        shapes(arg);
        for (const shape of literals) {
          assert.ok(INLINE.includes(shape), `${where} writes the shape ${shape} by hand`);
        }
      }
      ts.forEachChild(node, visit);
    };
    visit(file);
  }
  assert.ok(checked.length >= 10, `found the SDK's requestJson calls: ${checked.join(', ')}`);
});

/** What the Python SDK declares, read by Python's ast. */
interface PythonSdk {
  /** hostd/_types.py's classes. */
  classes: Record<string, { bases: string[]; fields: string[]; onlyDoc: boolean }>;
  /** hostd/_wire_gen.py's classes' keys, their bases' included. */
  wireFields: Record<string, string[]>;
  /** Names in the other modules' function signatures. */
  annotations: Array<{ where: string; name: string }>;
  /** TypedDicts the other modules write. */
  typedDicts: string[];
}

const python = ((): PythonSdk => {
  const script = `
import ast, json, os, sys
pkg = sys.argv[1]
def tree(name):
    return ast.parse(open(os.path.join(pkg, name)).read())
classes = {}
for c in tree('_types.py').body:
    if isinstance(c, ast.ClassDef):
        body = [s for s in c.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        classes[c.name] = {
            'bases': [ast.unparse(b) for b in c.bases],
            'fields': [s.target.id for s in c.body if isinstance(s, ast.AnnAssign)],
            'onlyDoc': not body,
        }
wire = {}
for c in tree('_wire_gen.py').body:
    if isinstance(c, ast.ClassDef):
        wire[c.name] = [s.target.id for s in c.body if isinstance(s, ast.AnnAssign)]
        for b in c.bases:
            if isinstance(b, ast.Name) and b.id in wire:
                wire[c.name] = wire[b.id] + wire[c.name]
annotations, typed_dicts = [], []
for name in sorted(os.listdir(pkg)):
    if not name.endswith('.py') or name in ('_types.py', '_wire_gen.py'):
        continue
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith('TypedDict') for b in node.bases):
            typed_dicts.append(name + ':' + node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            for ann in [a.annotation for a in args] + [node.returns]:
                for n in ast.walk(ann) if ann else []:
                    if isinstance(n, ast.Name):
                        annotations.append({'where': name + ':' + node.name, 'name': n.id})
print(json.dumps({'classes': classes, 'wireFields': wire, 'annotations': annotations, 'typedDicts': typed_dicts}))
`;
  const r = spawnSync('python3', ['-c', script, join(ROOT, 'sdk', 'python', 'hostd')], {
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as PythonSdk;
})();

test('Python: the payload names users import subclass the generated TypedDicts, adding nothing', () => {
  for (const { py, pyOf } of PAYLOADS) {
    if (!py) continue;
    const c = python.classes[py];
    assert.ok(c, `hostd/_types.py has the class ${py}`);
    assert.deepEqual(c.bases, [`_wire.${pyOf}`], `${py}'s base`);
    assert.ok(c.onlyDoc, `${py} has only a docstring: its keys are the generated ones`);
  }
  // The one written by hand has the keys of the answer it types (all required).
  assert.deepEqual(
    [...python.classes.TransferInfo!.fields].sort(),
    [...python.wireFields.FileWritten!].sort(),
  );
});

test("Python: the SDK's hand-written signatures use the payload types of hostd/_types.py", () => {
  assert.deepEqual(python.typedDicts, [], 'TypedDicts written outside _types.py');
  const payloads = new Set(PAYLOADS.flatMap((p) => (p.py ? [p.py] : [])).concat('TransferInfo'));
  const used = python.annotations.filter((a) => /Info$/.test(a.name) && a.name !== 'TarInfo');
  assert.ok(used.length >= 10, 'found the signatures that take or return payloads');
  for (const { where, name } of used) {
    assert.ok(payloads.has(name), `${where} uses ${name}, not a payload type of _types.py`);
  }
});
