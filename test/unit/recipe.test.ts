import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import {
  loadRecipes,
  MAX_WARMUP_BYTES,
  parseRecipe,
  RecipeError,
  RECIPE_DEFAULTS,
} from '../../src/core/recipe.js';

const ROOT = resolve(import.meta.dirname, '..', '..', '..');

/** The RecipeError that parsing `text` as `file` throws. */
function errorOf(text: string, file = '/r/t.toml'): RecipeError {
  try {
    parseRecipe(text, file);
  } catch (err) {
    assert.ok(err instanceof RecipeError, `not a RecipeError: ${String(err)}`);
    return err;
  }
  assert.fail('the recipe was accepted');
}

test('an empty recipe is a template named after its file, with default resources and nothing added', () => {
  const r = parseRecipe('', '/srv/templates/bare.toml');
  assert.equal(r.name, 'bare');
  assert.equal(r.file, '/srv/templates/bare.toml');
  assert.deepEqual(r.vm, RECIPE_DEFAULTS);
  assert.deepEqual(r.debianPackages, []);
  assert.deepEqual(r.files, []);
  assert.deepEqual(r.setup, []);
  assert.deepEqual(r.python, { packages: [], wheels: null, indexUrl: null });
  assert.deepEqual(r.preload, []);
  assert.equal(r.warmup, '');
  assert.deepEqual(r.env, {});
});

test('warmup is Python source kept as written, run once before the template is frozen', () => {
  const code = 'import io\nimport matplotlib.pyplot as plt\nplt.figure().savefig(io.BytesIO())\n';
  const r = parseRecipe(`preload = ["matplotlib.pyplot"]\nwarmup = '''\n${code}'''\n`, '/r/w.toml');
  assert.equal(r.warmup, code);
});

test('a warmup that is not a string, is blank or is too long names the field', () => {
  for (const text of [
    'warmup = ["print(1)"]',
    'warmup = 3',
    'warmup = "  \\n "',
    `warmup = "${'x'.repeat(MAX_WARMUP_BYTES + 1)}"`,
    '[vm]\nwarmup = "print(1)"',
  ]) {
    const err = errorOf(text);
    assert.match(err.field ?? '', /^(vm\.)?warmup$/, text.slice(0, 40));
  }
  assert.equal(errorOf('warmup = 3').problem, 'must be a string, got 3');
  assert.equal(errorOf('warmup = ""').problem, 'must not be empty (leave the field out instead)');
});

test('a full recipe is normalized: sorted unique packages, paths resolved against its directory', () => {
  const r = parseRecipe(
    `
description = "demo"
preload = ["numpy", "matplotlib.pyplot", "numpy"]
setup = "echo one"

[vm]
memory_mib = 1024
vcpus = 2
pool_size = 0
disk_mib = 8192

[debian]
packages = ["jq", "curl", "jq"]

[[files]]
src = "files/motd"
dest = "/etc/motd/"

[[files]]
src = "bin"
dest = "/usr/local/bin/tools"
mode = "0755"

[[files]]
src = "x"
dest = "/srv/x"
mode = 0o600

[python]
packages = ["hello==1.0"]
wheels = "wheels"

[env]
MPLBACKEND = "Agg"
`,
    '/srv/t/demo.toml',
  );
  assert.equal(r.description, 'demo');
  assert.deepEqual(r.vm, { memoryMib: 1024, vcpus: 2, poolSize: 0, diskMib: 8192 });
  // pip installs the Python packages, so Debian's pip comes with them.
  assert.deepEqual(r.debianPackages, ['curl', 'jq', 'python3-pip']);
  assert.deepEqual(r.files, [
    { src: '/srv/t/files/motd', dest: '/etc/motd', mode: null },
    { src: '/srv/t/bin', dest: '/usr/local/bin/tools', mode: 0o755 },
    { src: '/srv/t/x', dest: '/srv/x', mode: 0o600 },
  ]);
  assert.deepEqual(r.setup, ['echo one']);
  assert.deepEqual(r.python, { packages: ['hello==1.0'], wheels: '/srv/t/wheels', indexUrl: null });
  assert.deepEqual(r.preload, ['numpy', 'matplotlib.pyplot']);
  assert.deepEqual(r.env, { MPLBACKEND: 'Agg' });
});

test('an error names the file, the field, and the value it got', () => {
  const err = errorOf('[vm]\nmemory_mib = "x"\n', '/srv/templates/python.toml');
  assert.equal(
    err.message,
    'python.toml: vm.memory_mib must be an integer from 128 to 65536, got "x"',
  );
  assert.equal(err.file, '/srv/templates/python.toml');
  assert.equal(err.template, 'python');
  assert.equal(err.field, 'vm.memory_mib');
});

test('every field is checked', () => {
  const cases: [string, string][] = [
    ['[vm]\nvcpus = 0', 'vm.vcpus'],
    ['[vm]\npool_size = 1.5', 'vm.pool_size'],
    ['[vm]\ndisk_mib = 100', 'vm.disk_mib'],
    ['[vm]\ncpus = 2', 'vm.cpus'],
    ['[debian]\npackages = ["Bad Name"]', 'debian.packages[0]'],
    ['[debian]\npackages = "curl"', 'debian.packages'],
    ['[[files]]\nsrc = "/abs"\ndest = "/x"', 'files[0].src'],
    ['[[files]]\nsrc = "a"\ndest = "rel"', 'files[0].dest'],
    ['[[files]]\nsrc = "a"\ndest = "/"', 'files[0].dest'],
    ['[[files]]\nsrc = "a"\ndest = "/tmp/a"', 'files[0].dest'],
    ['[[files]]\nsrc = "a"\ndest = "/opt/hostd/agent.py"', 'files[0].dest'],
    ['[[files]]\nsrc = "a"', 'files[0].dest'],
    ['[[files]]\nsrc = "a"\ndest = "/a"\nmode = "rwx"', 'files[0].mode'],
    ['[[files]]\nsrc = "a"\ndest = "/a"\nmode = 0o17777', 'files[0].mode'],
    ['setup = ["ok", " "]', 'setup[1]'],
    ['[python]\npackages = ["--index-url=http://evil"]\nwheels = "w"', 'python.packages[0]'],
    ['[python]\npackages = ["x"]', 'python.packages'],
    ['[python]\nwheels = "w"', 'python.packages'],
    ['[python]\npackages = ["x"]\nindex_url = "ftp://x"', 'python.index_url'],
    ['preload = ["not-a-module"]', 'preload[0]'],
    ['[env]\n"1X" = "a"', 'env.1X'],
    ['[env]\nX = 1', 'env.X'],
    ['vm = 3', 'vm'],
    ['nonsense = 1', 'nonsense'],
  ];
  for (const [text, field] of cases) {
    assert.equal(errorOf(text).field, field, text);
  }
});

test('a top-level field written after a [table] is explained, not just rejected', () => {
  const err = errorOf('[vm]\nmemory_mib = 1024\npreload = ["numpy"]\n');
  assert.equal(err.field, 'vm.preload');
  assert.equal(
    err.problem,
    'is not a recipe field; top-level fields (preload) must come before the first [table] header',
  );
});

test('invalid TOML and a bad file name fail the whole file', () => {
  assert.equal(errorOf('[vm\n').field, null);
  assert.equal(errorOf('', '/r/Bad_Name.toml').field, null);
  assert.equal(errorOf('', '/r/recipe.yaml').field, null);
});

test('loading directories: a broken recipe fails alone; a later directory redefines a name in place', async () => {
  const base = await mkdtemp(join(tmpdir(), 'recipes-'));
  try {
    await mkdir(join(base, 'builtin'));
    await mkdir(join(base, 'user'));
    await writeFile(join(base, 'builtin', 'python.toml'), '[vm]\nmemory_mib = 1024\n');
    await writeFile(join(base, 'builtin', 'python-slim.toml'), '');
    await writeFile(join(base, 'user', 'python.toml'), '[vm]\nmemory_mib = 2048\n');
    await writeFile(join(base, 'user', 'broken.toml'), '[vm]\nmemory_mib = "lots"\n');
    await writeFile(join(base, 'user', 'notes.txt'), 'not a recipe');
    const { recipes, errors } = await loadRecipes([
      join(base, 'builtin'),
      join(base, 'user'),
      join(base, 'missing'),
    ]);
    assert.deepEqual(
      recipes.map((r) => [r.name, r.vm.memoryMib]),
      [
        ['python', 2048],
        ['python-slim', 512],
      ],
    );
    assert.deepEqual(
      errors.map((e) => [e.template, e.field]),
      [['broken', 'vm.memory_mib']],
    );
  } finally {
    await rm(base, { recursive: true });
  }
});

test('the built-in templates: python (the default, first) with the data stack preloaded, and python-slim', async () => {
  const { recipes, errors } = await loadRecipes([join(ROOT, 'templates')]);
  assert.deepEqual(errors, []);
  assert.deepEqual(
    recipes.map((r) => r.name),
    ['python', 'python-slim'],
  );
  const python = recipes[0]!;
  assert.deepEqual(python.preload.slice(0, 3), ['numpy', 'pandas', 'matplotlib.pyplot']);
  for (const m of ['scipy.stats', 'sklearn.linear_model', 'sympy', 'requests']) {
    assert.ok(python.preload.includes(m), m);
  }
  assert.match(python.warmup, /savefig/);
  assert.match(python.warmup, /groupby/);
  assert.equal(python.env.MPLBACKEND, 'Agg');
  for (const p of [
    'python3-numpy',
    'python3-pandas',
    'python3-sklearn',
    'python3-pip',
    'git',
    'jq',
  ]) {
    assert.ok(python.debianPackages.includes(p), p);
  }
  assert.deepEqual(recipes[1]!.debianPackages, []);
});

test('the worked example of docs/templates.md is a valid recipe', async () => {
  const { recipes, errors } = await loadRecipes([join(ROOT, 'examples', 'templates')]);
  assert.deepEqual(errors, []);
  assert.equal(recipes.length, 1);
});
