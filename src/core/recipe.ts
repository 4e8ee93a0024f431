/**
 * Template recipes: one TOML file per template (docs/templates.md), parsed and validated into
 * the typed, normalized form the image builder takes. Built-in recipes live in the repository's
 * templates/; users add theirs in SERVICE_TEMPLATE_DIR without touching code.
 */
import { readdir, readFile } from 'node:fs/promises';
import { basename, dirname, isAbsolute, join, posix, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse, TomlError } from 'smol-toml';
import type { TemplateFile, TemplateResources, TemplateSpec } from '../vm/image/image-builder.js';

/** A validated recipe: everything the builder needs, plus where it came from. */
export interface Recipe extends TemplateSpec {
  /** Absolute path of the recipe file. */
  readonly file: string;
}

/**
 * A recipe that cannot be used, naming the file and the field, so that one broken recipe fails
 * only its own template. `message` reads like `python.toml: vm.memory_mib must be ...`.
 */
export class RecipeError extends Error {
  constructor(
    /** Absolute path of the recipe file. */
    readonly file: string,
    /** The template the file defines (its name without .toml). */
    readonly template: string,
    /** Dotted path of the offending field (`files[0].src`), or null for the whole file. */
    readonly field: string | null,
    /** What is wrong, without the file and field. */
    readonly problem: string,
  ) {
    super(`${basename(file)}: ${field === null ? '' : `${field} `}${problem}`);
    this.name = 'RecipeError';
  }
}

const NAME = /^[a-z0-9][a-z0-9-]{0,62}$/;
const DEBIAN_PACKAGE = /^[a-z0-9][a-z0-9+.-]+$/;
const MODULE = /^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$/;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** Guest paths a file may not go to: the build mounts over them, or hostd owns them. */
const RESERVED_DESTS = ['/proc', '/sys', '/dev', '/run', '/tmp', '/opt/hostd', '/etc/hostd'];
const TOP_LEVEL = [
  'description',
  'preload',
  'warmup',
  'setup',
  'vm',
  'debian',
  'files',
  'python',
  'env',
];
/** The most Python a warm-up may hold: it is a few lines of first use, not a program. */
export const MAX_WARMUP_BYTES = 64 * 1024;
const FIELDS: Record<string, readonly string[]> = {
  vm: ['memory_mib', 'vcpus', 'pool_size', 'disk_mib'],
  debian: ['packages'],
  python: ['packages', 'wheels', 'index_url'],
  file: ['src', 'dest', 'mode'],
};

/** The repository's own recipes (templates/); SERVICE_TEMPLATE_DIR's come after them. */
export const BUILTIN_RECIPE_DIR = fileURLToPath(new URL('../../../templates/', import.meta.url));

/** Resource defaults of a recipe that leaves them out. */
export const RECIPE_DEFAULTS = { memoryMib: 512, vcpus: 1, poolSize: 2, diskMib: 4096 } as const;

type Table = Record<string, unknown>;

/** A short description of a TOML value for error messages: `got "x"`, `got an array`. */
function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (Array.isArray(value)) return 'an array';
  if (value instanceof Date) return 'a date';
  return 'a table';
}

function isTable(value: unknown): value is Table {
  return (
    typeof value === 'object' && value !== null && !Array.isArray(value) && !(value instanceof Date)
  );
}

/**
 * Parses one recipe file's text. Pure: relative paths are resolved against the file's
 * directory but not checked (the builder reads them). Throws RecipeError.
 *
 * @example parseRecipe('[vm]\nmemory_mib = 1024\n', '/srv/templates/big.toml').vm.memoryMib // 1024
 */
export function parseRecipe(text: string, file: string): Recipe {
  const r = new FieldReader(file);
  if (!file.endsWith('.toml') || !NAME.test(r.template)) {
    r.fail(null, 'the file name must be NAME.toml, NAME of a-z, 0-9 and - (at most 63)');
  }
  let doc: Table;
  try {
    doc = parse(text) as Table;
  } catch (err) {
    if (!(err instanceof TomlError)) throw err;
    const what = err.message.split('\n')[0];
    return r.fail(null, `is not valid TOML (line ${err.line}, column ${err.column}): ${what}`);
  }
  r.checkKeys(doc, TOP_LEVEL, '');
  const python = readPython(r, r.table(doc.python, 'python'));
  return {
    name: r.template,
    file,
    description: doc.description === undefined ? '' : r.string(doc.description, 'description'),
    vm: readVm(r, r.table(doc.vm, 'vm')),
    // pip needs pip: a recipe that installs Python packages gets Debian's.
    debianPackages: [
      ...new Set([
        ...readDebian(r, r.table(doc.debian, 'debian')),
        ...(python.packages.length > 0 ? ['python3-pip'] : []),
      ]),
    ].sort(),
    files: readFiles(r, doc.files),
    setup: r.strings(typeof doc.setup === 'string' ? [doc.setup] : doc.setup, 'setup', (s, f) => {
      if (s.trim() === '') r.fail(f, 'must not be empty');
    }),
    python,
    preload: [
      ...new Set(
        r.strings(doc.preload, 'preload', (s, f) => {
          if (!MODULE.test(s)) {
            r.fail(
              f,
              `must be a module name like "numpy" or "matplotlib.pyplot", got ${describe(s)}`,
            );
          }
        }),
      ),
    ],
    warmup: readWarmup(r, doc.warmup),
    env: readEnv(r, r.table(doc.env, 'env')),
  };
}

/** Typed access to a recipe's TOML values; every failure is a RecipeError naming the field. */
class FieldReader {
  readonly template: string;
  readonly dir: string;

  constructor(readonly file: string) {
    this.template = basename(file).replace(/\.toml$/, '');
    this.dir = dirname(file);
  }

  fail(field: string | null, problem: string): never {
    throw new RecipeError(this.file, this.template, field, problem);
  }

  /** Rejects keys of `table` not in `allowed`; `prefix` is the table's own field name. */
  checkKeys(table: Table, allowed: readonly string[], prefix: string): void {
    for (const key of Object.keys(table)) {
      if (allowed.includes(key)) continue;
      const field = prefix ? `${prefix}.${key}` : key;
      // TOML puts a key under the last [table] header above it: a top-level field written
      // after [vm] becomes vm.<field>.
      const hint =
        prefix && TOP_LEVEL.includes(key)
          ? `; top-level fields (${key}) must come before the first [table] header`
          : ` (fields${prefix ? ` of ${prefix}` : ''}: ${allowed.join(', ')})`;
      this.fail(field, `is not a recipe field${hint}`);
    }
  }

  table(value: unknown, field: string): Table {
    if (value === undefined) return {};
    if (!isTable(value)) this.fail(field, `must be a table, got ${describe(value)}`);
    return value;
  }

  string(value: unknown, field: string): string {
    if (typeof value !== 'string') this.fail(field, `must be a string, got ${describe(value)}`);
    return value;
  }

  integer(value: unknown, field: string, min: number, max: number, dflt: number): number {
    if (value === undefined) return dflt;
    if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
      this.fail(field, `must be an integer from ${min} to ${max}, got ${describe(value)}`);
    }
    return value;
  }

  /** An optional array of strings, each passed to `check` with its field name. */
  strings(value: unknown, field: string, check: (s: string, field: string) => void): string[] {
    if (value === undefined) return [];
    if (!Array.isArray(value)) {
      this.fail(field, `must be an array of strings, got ${describe(value)}`);
    }
    return value.map((v: unknown, i) => {
      const s = this.string(v, `${field}[${i}]`);
      check(s, `${field}[${i}]`);
      return s;
    });
  }

  /** A path relative to the recipe's directory, made absolute. */
  relativePath(value: unknown, field: string): string {
    const p = this.string(value, field);
    if (p === '' || isAbsolute(p)) {
      this.fail(field, `must be a path relative to the recipe's directory, got ${describe(p)}`);
    }
    return resolve(this.dir, p);
  }
}

function readVm(r: FieldReader, vm: Table): TemplateResources {
  r.checkKeys(vm, FIELDS.vm!, 'vm');
  const d = RECIPE_DEFAULTS;
  return {
    memoryMib: r.integer(vm.memory_mib, 'vm.memory_mib', 128, 65536, d.memoryMib),
    vcpus: r.integer(vm.vcpus, 'vm.vcpus', 1, 16, d.vcpus),
    poolSize: r.integer(vm.pool_size, 'vm.pool_size', 0, 64, d.poolSize),
    diskMib: r.integer(vm.disk_mib, 'vm.disk_mib', 256, 1048576, d.diskMib),
  };
}

function readDebian(r: FieldReader, debian: Table): string[] {
  r.checkKeys(debian, FIELDS.debian!, 'debian');
  return r.strings(debian.packages, 'debian.packages', (s, f) => {
    if (!DEBIAN_PACKAGE.test(s)) r.fail(f, `must be a Debian package name, got ${describe(s)}`);
  });
}

function readFiles(r: FieldReader, files: unknown): TemplateFile[] {
  if (files === undefined) return [];
  if (!Array.isArray(files)) {
    r.fail('files', `must be an array of tables ([[files]]), got ${describe(files)}`);
  }
  return files.map((entry: unknown, i): TemplateFile => {
    const at = `files[${i}]`;
    const f = r.table(entry, at);
    r.checkKeys(f, FIELDS.file!, at);
    if (f.src === undefined) r.fail(`${at}.src`, 'is required');
    if (f.dest === undefined) r.fail(`${at}.dest`, 'is required');
    const rawDest = r.string(f.dest, `${at}.dest`);
    const dest = posix.normalize(rawDest).replace(/\/$/, '');
    if (!rawDest.startsWith('/') || dest === '' || dest === '/') {
      r.fail(`${at}.dest`, `must be an absolute path in the guest, got ${describe(rawDest)}`);
    }
    const reserved = RESERVED_DESTS.find((d) => dest === d || dest.startsWith(`${d}/`));
    if (reserved)
      r.fail(`${at}.dest`, `must not be under ${reserved} (the build or hostd owns it)`);
    return {
      src: r.relativePath(f.src, `${at}.src`),
      dest,
      mode: readMode(r, f.mode, `${at}.mode`),
    };
  });
}

/** A file mode: TOML's octal integer (0o644) or a string of octal digits ("0644"). */
function readMode(r: FieldReader, value: unknown, field: string): number | null {
  if (value === undefined) return null;
  let mode: number | null = null;
  if (typeof value === 'string' && /^0?[0-7]{3,4}$/.test(value)) mode = parseInt(value, 8);
  else if (typeof value === 'number' && Number.isInteger(value)) mode = value;
  if (mode === null) {
    r.fail(field, `must be an octal mode like "0644" or 0o644, got ${describe(value)}`);
  }
  if (mode < 0 || mode > 0o7777)
    r.fail(field, `must be from 0 to 0o7777, got 0o${mode.toString(8)}`);
  return mode;
}

function readPython(r: FieldReader, py: Table): TemplateSpec['python'] {
  r.checkKeys(py, FIELDS.python!, 'python');
  const packages = r.strings(py.packages, 'python.packages', (s, f) => {
    // Requirement specifiers only: an option here would change how pip runs.
    if (s === '' || s.startsWith('-') || /\s/.test(s)) {
      r.fail(f, `must be a requirement like "name" or "name==1.0", got ${describe(s)}`);
    }
  });
  const wheels = py.wheels === undefined ? null : r.relativePath(py.wheels, 'python.wheels');
  let indexUrl: string | null = null;
  if (py.index_url !== undefined) {
    indexUrl = r.string(py.index_url, 'python.index_url');
    if (!/^https?:\/\/\S+$/.test(indexUrl)) {
      r.fail('python.index_url', `must be an http(s) URL, got ${describe(indexUrl)}`);
    }
  }
  if (packages.length > 0 && wheels === null && indexUrl === null) {
    r.fail(
      'python.packages',
      'needs python.wheels (a directory of wheels) or python.index_url: no package index is assumed reachable',
    );
  }
  if (packages.length === 0 && (wheels !== null || indexUrl !== null)) {
    r.fail(
      'python.packages',
      'is empty: name the packages to install from python.wheels or python.index_url',
    );
  }
  return { packages, wheels, indexUrl };
}

/** Python source, run once in the template before it is frozen; '' when there is none. */
function readWarmup(r: FieldReader, value: unknown): string {
  if (value === undefined) return '';
  const code = r.string(value, 'warmup');
  if (code.trim() === '') r.fail('warmup', 'must not be empty (leave the field out instead)');
  if (Buffer.byteLength(code) > MAX_WARMUP_BYTES) {
    r.fail('warmup', `must be at most ${MAX_WARMUP_BYTES} bytes of Python`);
  }
  if (code.includes('\0')) r.fail('warmup', 'must not contain NUL characters');
  return code;
}

function readEnv(r: FieldReader, env: Table): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) {
    if (!ENV_NAME.test(k)) r.fail(`env.${k}`, 'is not a valid environment variable name');
    out[k] = r.string(v, `env.${k}`);
  }
  return out;
}

/** Reads and parses one recipe file; a file that cannot be read is a RecipeError too. */
export async function loadRecipe(file: string): Promise<Recipe> {
  const path = resolve(file);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new RecipeError(
      path,
      basename(path).replace(/\.toml$/, ''),
      null,
      // The code, not the message: the message names the file's path, which clients see.
      `cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`,
    );
  }
  return parseRecipe(text, path);
}

/** Every template the directories define, and the recipes that failed. */
export interface RecipeCatalog {
  /** In order: the first directory's recipes by name, then each later directory's new ones. */
  readonly recipes: readonly Recipe[];
  readonly errors: readonly RecipeError[];
}

/**
 * Loads every `*.toml` of `dirs` (the built-in templates/ first, then SERVICE_TEMPLATE_DIR).
 * A recipe in a later directory replaces an earlier one of the same name, keeping its place
 * in the order, so a user can redefine `python`; if the replacement is broken, the template
 * fails rather than silently falling back. A directory that does not exist holds no recipes.
 */
export async function loadRecipes(dirs: readonly string[]): Promise<RecipeCatalog> {
  const order: string[] = [];
  const byName = new Map<string, Recipe | RecipeError>();
  for (const dir of dirs) {
    let names: string[];
    try {
      // By template name: sorting file names would put python-slim.toml before python.toml.
      names = (await readdir(dir))
        .filter((n) => n.endsWith('.toml'))
        .map((n) => n.slice(0, -'.toml'.length))
        .sort()
        .map((n) => `${n}.toml`);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
      throw err;
    }
    for (const n of names) {
      let result: Recipe | RecipeError;
      try {
        result = await loadRecipe(join(dir, n));
      } catch (err) {
        if (!(err instanceof RecipeError)) throw err;
        result = err;
      }
      const name = result instanceof RecipeError ? result.template : result.name;
      if (!byName.has(name)) order.push(name);
      byName.set(name, result);
    }
  }
  const all = order.map((n) => byName.get(n)!);
  return {
    recipes: all.filter((r): r is Recipe => !(r instanceof RecipeError)),
    errors: all.filter((r): r is RecipeError => r instanceof RecipeError),
  };
}
