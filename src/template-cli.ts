/**
 * `npm run template -- COMMAND`: lists, builds and shows templates without starting hostd, so
 * that images can be built ahead (scripts/run.sh does before every start) and recipes tried out.
 *
 *   list                      every template: recipe file, resources, built or not
 *   build NAME... | --all     builds (or finds in the cache); one failure does not stop the rest
 *   show NAME                 the normalized recipe and, when built, its manifest
 *   path [--cached] NAME      builds unless --cached, then prints the template directory
 *
 * Templates are the recipes of templates/ and of SERVICE_TEMPLATE_DIR (docs/templates.md);
 * images go to SERVICE_CACHE_DIR. Build output goes to stderr only with --verbose (-v); the
 * steps are always shown. Exit status: 0, 1 when a build failed, 2 for a bad command or recipe.
 */
import { BUILTIN_RECIPE_DIR, loadRecipes, RecipeError, type Recipe } from './core/recipe.js';
import { TemplateBuildError } from './vm/image/build-step.js';
import { loadTemplateSettings } from './config.js';
import { buildTemplate, findBuilt, rootfsKeyOf } from './vm/image/image-builder.js';

const USAGE = `usage: npm run template -- list
       npm run template -- build [-v] NAME... | --all
       npm run template -- show NAME
       npm run template -- path [--cached] NAME`;

const say = (line: string): void => void process.stderr.write(`${line}\n`);
// The scripts run in their own process groups (so that a cancel stops all of their children):
// a Ctrl-C reaches only us, and we stop them.
const interrupted = new AbortController();
process.once('SIGINT', () => interrupted.abort());
process.once('SIGTERM', () => interrupted.abort());

async function main(argv: string[]): Promise<number> {
  const verbose = argv.some((a) => a === '-v' || a === '--verbose');
  const args = argv.filter((a) => a !== '-v' && a !== '--verbose');
  const [command, ...rest] = args;
  const { cacheDir, templateDir } = loadTemplateSettings();
  const catalog = await loadRecipes([BUILTIN_RECIPE_DIR, ...(templateDir ? [templateDir] : [])]);
  const find = (name: string): Recipe | RecipeError | undefined =>
    catalog.recipes.find((r) => r.name === name) ?? catalog.errors.find((e) => e.template === name);

  switch (command) {
    case 'list': {
      for (const r of catalog.recipes) {
        const built = await findBuilt(r, { cacheDir });
        const { memoryMib, vcpus, poolSize, diskMib } = r.vm;
        process.stdout.write(
          `${r.name.padEnd(16)} ${built ? 'built    ' : 'not built'} ${memoryMib} MiB, ${vcpus} vCPU, pool ${poolSize}, disk ${diskMib} MiB  ${r.file}\n`,
        );
      }
      for (const e of catalog.errors) {
        process.stdout.write(`${e.template.padEnd(16)} invalid   ${e.message}\n`);
      }
      return 0;
    }
    case 'build': {
      const all = rest.includes('--all');
      const names = all ? [...catalog.recipes, ...catalog.errors].map(nameOf) : rest;
      if (names.length === 0) return usage();
      let failed = 0;
      for (const name of names) {
        if (!(await buildOne(find(name), name, cacheDir, verbose))) failed++;
      }
      if (failed > 0) say(`${failed} of ${names.length} templates failed to build`);
      return failed > 0 ? 1 : 0;
    }
    case 'show': {
      if (rest.length !== 1) return usage();
      const r = find(rest[0]!);
      if (!(r && !(r instanceof RecipeError))) return notFound(r, rest[0]!);
      const built = await findBuilt(r, { cacheDir });
      const out = {
        recipe: r,
        rootfs_key: await rootfsKeyOf(r),
        dir: built?.dir ?? null,
        manifest: built?.manifest ?? null,
      };
      process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
      return 0;
    }
    case 'path': {
      const cached = rest.includes('--cached');
      const names = rest.filter((a) => a !== '--cached');
      if (names.length !== 1) return usage();
      const r = find(names[0]!);
      if (!(r && !(r instanceof RecipeError))) return notFound(r, names[0]!);
      if (cached) {
        const built = await findBuilt(r, { cacheDir });
        if (!built) {
          say(`template "${r.name}" is not built`);
          return 1;
        }
        process.stdout.write(`${built.dir}\n`);
        return 0;
      }
      const built = await buildQuietly(r, cacheDir, verbose);
      if (!built) return 1;
      process.stdout.write(`${built}\n`);
      return 0;
    }
    default:
      return usage();
  }
}

const nameOf = (r: Recipe | RecipeError): string =>
  r instanceof RecipeError ? r.template : r.name;

function usage(): number {
  say(USAGE);
  return 2;
}

function notFound(r: RecipeError | undefined, name: string): number {
  say(r ? r.message : `no template "${name}" (see npm run template -- list)`);
  return 2;
}

async function buildOne(
  r: Recipe | RecipeError | undefined,
  name: string,
  cacheDir: string,
  verbose: boolean,
) {
  if (!r || r instanceof RecipeError) {
    say(`${name}: FAILED: ${r ? r.message : 'no such template'}`);
    return false;
  }
  const t0 = Date.now();
  const dir = await buildQuietly(r, cacheDir, verbose);
  if (dir) say(`${name}: ready in ${((Date.now() - t0) / 1000).toFixed(1)} s: ${dir}`);
  return dir !== null;
}

/** Builds one template, printing its steps (and with `verbose` all output); null on failure. */
async function buildQuietly(r: Recipe, cacheDir: string, verbose: boolean): Promise<string | null> {
  try {
    const built = await buildTemplate(r, {
      cacheDir,
      signal: interrupted.signal,
      onLine: (line) => {
        if (verbose) say(line);
        else if (line.startsWith('hostd-build-step: ')) say(`${r.name}: ${line.slice(18)}`);
      },
    });
    return built.dir;
  } catch (err) {
    if (!(err instanceof TemplateBuildError)) throw err;
    say(`${r.name}: FAILED: ${err.message}`);
    return null;
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    say(`template: ${(err as Error).stack ?? String(err)}`);
    process.exit(2);
  },
);
