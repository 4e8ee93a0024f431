/**
 * The TypeScript and Python SDKs stay method for method in step. Neither side is a hard-coded
 * list: the TypeScript surface is read from this package's source with the TypeScript
 * compiler, the Python surface by importing sdk/python and inspecting it. Names map by rule:
 * camelCase to snake_case, an `xMs` option to Python's `x` in seconds (the standard library's
 * unit), an options object's fields to keyword arguments (a nested `...Options` object's fields
 * too: `network.allowOut` is `allow_out`), `signal` is TypeScript's own.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';
import ts from 'typescript';
import * as sdk from '../src/index.js';
import { PACKAGE_DIR, REPO_ROOT } from './helpers/live.js';

const CLASSES = ['Sandbox', 'Files', 'Snapshot', 'Template'];
const SHAPES = [
  'SandboxInfo',
  'NetworkInfo',
  'MergeInfo',
  'EntryInfo',
  'WriteInfo',
  'TransferInfo',
  'SnapshotInfo',
  'TemplateInfo',
  'Display',
  'RunResult',
  'CellError',
  'ContextInfo',
];
/** Methods only one language has a use for: JavaScript's conversions. */
const TS_ONLY = new Set(['toString', 'toJSON']);

interface Method {
  static: boolean;
  params: string[];
}
type Surface = Record<string, Record<string, Method>>;

interface PythonSurface {
  classes: Surface;
  errors: Record<string, string>;
  shapes: Record<string, string[]>;
  builtins: string[];
}

const PYTHON_SCRIPT = `
import builtins, dataclasses, inspect, json, typing
import hostd

def method(value):
    static = isinstance(value, (classmethod, staticmethod))
    fn = value.__func__ if static else value
    params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
    return {"static": static, "params": params}

classes = {}
for name in ${JSON.stringify(CLASSES)}:
    cls = getattr(hostd, name)
    classes[name] = {
        k: method(v) for k, v in vars(cls).items()
        if not k.startswith("_") and (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod)))
    }
errors = {
    name: value.code for name, value in vars(hostd).items()
    if inspect.isclass(value) and issubclass(value, hostd.HostdError) and value.__name__ == name
}
shapes = {}
for name in ${JSON.stringify(SHAPES)}:
    cls = getattr(hostd, name)
    shapes[name] = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(typing.get_type_hints(cls))
print(json.dumps({"classes": classes, "errors": errors, "shapes": shapes,
                  "builtins": [n for n in dir(builtins) if isinstance(getattr(builtins, n), type)]}))
`;

function pythonSurface(): PythonSurface {
  const r = spawnSync('python3', ['-c', PYTHON_SCRIPT], {
    env: { ...process.env, PYTHONPATH: join(REPO_ROOT, 'sdk', 'python') },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as PythonSurface;
}

/** The exported classes' methods and the exported interfaces' fields, from the source. */
function typescriptSurface(): { classes: Surface; shapes: Record<string, string[]> } {
  const program = ts.createProgram([join(PACKAGE_DIR, 'src', 'index.ts')], {
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2022,
    strict: true,
    types: ['node'],
  });
  const checker = program.getTypeChecker();
  const index = program.getSourceFile(join(PACKAGE_DIR, 'src', 'index.ts'))!;
  const exports = new Map(
    checker
      .getExportsOfModule(checker.getSymbolAtLocation(index)!)
      .map((s) => [s.name, s.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(s) : s]),
  );

  /** Option names of an options type, nested `...Options` objects flattened. */
  const optionNames = (type: ts.Type, at: ts.Node): string[] =>
    checker.getPropertiesOfType(type).flatMap((p) => {
      const propType = checker.getNonNullableType(checker.getTypeOfSymbolAtLocation(p, at));
      const alias = (propType.aliasSymbol ?? propType.getSymbol())?.name ?? '';
      return alias.endsWith('Options') ? optionNames(propType, at) : [p.name];
    });

  const methodOf = (symbol: ts.Symbol, isStatic: boolean, at: ts.Node): Method => {
    const type = checker.getTypeOfSymbolAtLocation(symbol, at);
    const signature = type.getCallSignatures()[0]!;
    const params = signature.getParameters().flatMap((p) => {
      if (p.name !== 'opts') return [p.name];
      return optionNames(checker.getTypeOfSymbolAtLocation(p, at), at);
    });
    return { static: isStatic, params: params.filter((p) => p !== 'signal') };
  };

  const classes: Surface = {};
  for (const name of CLASSES) {
    const symbol = exports.get(name)!;
    const decl = symbol.valueDeclaration as ts.ClassDeclaration;
    const methods: Record<string, Method> = {};
    for (const member of decl.members) {
      if (!ts.isMethodDeclaration(member) || !ts.isIdentifier(member.name)) continue;
      const modifiers = ts.getCombinedModifierFlags(member);
      if (modifiers & (ts.ModifierFlags.Private | ts.ModifierFlags.Protected)) continue;
      if (TS_ONLY.has(member.name.text)) continue;
      const memberSymbol = checker.getSymbolAtLocation(member.name)!;
      methods[member.name.text] = methodOf(
        memberSymbol,
        (modifiers & ts.ModifierFlags.Static) !== 0,
        member,
      );
    }
    classes[name] = methods;
  }
  const shapes: Record<string, string[]> = {};
  for (const name of SHAPES) {
    const symbol = exports.get(name)!;
    shapes[name] = checker
      .getPropertiesOfType(checker.getDeclaredTypeOfSymbol(symbol))
      .map((p) => p.name);
  }
  return { classes, shapes };
}

/** A TypeScript name as Python spells it. */
function pythonName(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

/** Option names as Python spells them: `timeoutMs` is `timeout` in seconds there. */
function pythonParam(name: string): string {
  return pythonName(name).replace(/_ms$/, '');
}

describe('TypeScript and Python SDKs, method for method', () => {
  let py: PythonSurface;
  let tsSurface: ReturnType<typeof typescriptSurface>;
  before(() => {
    py = pythonSurface();
    tsSurface = typescriptSurface();
  });

  for (const name of CLASSES) {
    test(`${name}: the same methods, static where the other is, with the same parameters`, () => {
      const ours = tsSurface.classes[name]!;
      const theirs = py.classes[name]!;
      assert.ok(Object.keys(ours).length > 0, `no methods read for ${name}`);
      assert.deepEqual(
        Object.keys(ours).map(pythonName).sort(),
        Object.keys(theirs).sort(),
        `${name}: methods differ`,
      );
      for (const [method, m] of Object.entries(ours)) {
        const other = theirs[pythonName(method)]!;
        assert.equal(m.static, other.static, `${name}.${method}: static in one SDK only`);
        assert.deepEqual(
          m.params.map(pythonParam).sort(),
          [...other.params].sort(),
          `${name}.${method}: parameters differ`,
        );
      }
    });
  }

  test('the same error classes for the same codes', () => {
    const ours: Record<string, string> = {};
    for (const [name, value] of Object.entries(sdk)) {
      const code = (value as { errorCode?: unknown }).errorCode;
      if (typeof value === 'function' && typeof code === 'string' && value.name === name) {
        ours[code] = name;
      }
    }
    const theirs = Object.fromEntries(
      Object.entries(py.errors).map(([name, code]) => [code, name]),
    );
    // A class whose name is a Python builtin (ConnectionError) keeps the Exception suffix there.
    const expected = Object.fromEntries(
      Object.entries(ours).map(([code, name]) => [
        code,
        py.builtins.includes(name) ? name.replace(/Error$/, 'Exception') : name,
      ]),
    );
    assert.ok(Object.keys(ours).length >= 20, `only ${Object.keys(ours).length} error classes`);
    assert.deepEqual(theirs, expected);
  });

  for (const name of SHAPES) {
    test(`${name} has the same fields`, () => {
      assert.deepEqual(
        tsSurface.shapes[name]!.map(pythonName).sort(),
        [...py.shapes[name]!].sort(),
      );
    });
  }
});
