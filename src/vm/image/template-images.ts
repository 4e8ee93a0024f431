/**
 * Templates' images for hostd: the builder's cache (vm/image/image-builder.ts) behind core's
 * `TemplateImages`, so that hostd finds what `npm run template` built and builds the rest itself.
 * Builds of one template are serialized with other processes by the cache's file lock.
 */
import { readLogTail, TemplateBuildError } from './build-step.js';
import { buildLogPath, buildTemplate, findBuilt, type TemplateSpec } from './image-builder.js';
import type { LoadedImage } from './image.js';
import type { TemplateImage, TemplateImages } from '../machine.js';

/** Lines of the build log a failed template's reason quotes. */
const REASON_TAIL_LINES = 10;
/** The most of a build log `buildLog` returns: its end, where a failing step is. */
const LOG_TAIL_BYTES = 256 * 1024;

/** A built template: what core shows, and the directory the hypervisor boots. */
export class BuiltImage implements TemplateImage {
  readonly key: string;
  readonly builtAt: string;
  readonly diskMib: number;
  readonly debianPackages: readonly string[];
  readonly pythonPackages: readonly string[];
  readonly preload: readonly string[];
  readonly warmup: string;

  constructor(readonly loaded: LoadedImage) {
    const m = loaded.manifest;
    this.key = m.key;
    this.builtAt = m.built_at;
    this.diskMib = m.resources.disk_mib;
    this.debianPackages = m.contents.debian_packages.map((p) => p.name);
    this.pythonPackages = m.contents.python_packages.map((p) => p.name);
    this.preload = m.preload;
    this.warmup = m.warmup ?? '';
  }
}

export interface CacheOptions {
  readonly cacheDir: string;
  /** Called with each step a build announces (`debian packages`, `setup command 1 of 2: …`). */
  readonly onStep?: (template: string, step: string) => void;
  /** Throws when the built image is unusable here (e.g. QEMU's account cannot read it). */
  readonly check?: (image: LoadedImage) => void;
}

/** The builder's cache as core's `TemplateImages`. */
export class CachedTemplateImages implements TemplateImages {
  /** Lookups started by `lookAhead`, each for the next `find` of its recipe. */
  private readonly ahead = new Map<TemplateSpec, Promise<LoadedImage | null>>();

  constructor(private readonly opts: CacheOptions) {}

  /**
   * Starts looking these recipes up now, for the next `find` of each: hostd's start calls it
   * before it builds its servers, so that the lookups (bash scripts computing keys, hashing)
   * run meanwhile instead of after them, before hostd serves.
   */
  lookAhead(recipes: readonly TemplateSpec[]): void {
    for (const recipe of recipes) {
      const lookup = findBuilt(recipe, { cacheDir: this.opts.cacheDir });
      lookup.catch(() => {}); // the `find` that takes it reports the failure
      this.ahead.set(recipe, lookup);
    }
  }

  async find(recipe: TemplateSpec): Promise<BuiltImage | null> {
    const ahead = this.ahead.get(recipe);
    this.ahead.delete(recipe);
    const loaded = await (ahead ?? findBuilt(recipe, { cacheDir: this.opts.cacheDir }));
    if (!loaded) return null;
    this.opts.check?.(loaded);
    return new BuiltImage(loaded);
  }

  /** The log's end as a client may read it: the host paths it quotes named by what they are. */
  async buildLog(recipe: TemplateSpec): Promise<string | null> {
    const { cacheDir } = this.opts;
    const tail = await readLogTail(buildLogPath(cacheDir, recipe.name), LOG_TAIL_BYTES);
    return tail === null ? null : withoutHostPaths(tail, recipe, cacheDir);
  }

  async build(recipe: TemplateSpec, signal: AbortSignal): Promise<BuiltImage> {
    const { onStep } = this.opts;
    try {
      const loaded = await buildTemplate(recipe, {
        cacheDir: this.opts.cacheDir,
        signal,
        onLine: (line) => {
          if (line.startsWith('hostd-build-step: ')) onStep?.(recipe.name, line.slice(18));
        },
      });
      this.opts.check?.(loaded);
      return new BuiltImage(loaded);
    } catch (err) {
      if (signal.aborted) throw err;
      throw new Error(clientBuildFailure(err, recipe, this.opts.cacheDir), { cause: err });
    }
  }
}

/** Why a build failed, for API clients (`TemplateImages.build`): no host path in it. */
export function clientBuildFailure(err: unknown, recipe: TemplateSpec, cacheDir: string): string {
  const why =
    err instanceof TemplateBuildError
      ? buildFailure(err)
      : `the build failed: ${err instanceof Error ? err.message : String(err)}`;
  return withoutHostPaths(why, recipe, cacheDir);
}

/**
 * `text` with the host paths a build knows named by what they are: the cache directory by its
 * variable, the recipe's files and wheels by their fields. A build's log quotes the files it
 * read and made, and messages for clients name no host directory.
 */
function withoutHostPaths(text: string, recipe: TemplateSpec, cacheDir: string): string {
  const names: [string, string][] = [
    [cacheDir, '$SERVICE_CACHE_DIR'],
    ...recipe.files.map((f, i): [string, string] => [f.src, `<files[${i}].src>`]),
    ...(recipe.python.wheels
      ? [[recipe.python.wheels, '<python.wheels>'] as [string, string]]
      : []),
  ];
  // Longest first: a file's path may start with another's directory.
  names.sort(([a], [b]) => b.length - a.length);
  let out = text;
  for (const [path, name] of names) if (path.length > 1) out = out.replaceAll(path, name);
  return out;
}

/**
 * Why a build failed, for API clients: the step and the end of its log. The log file's own path
 * is left out (it is in hostd's log, and error messages do not name host files).
 */
export function buildFailure(err: TemplateBuildError): string {
  const tail = err.tail.slice(-REASON_TAIL_LINES);
  return (
    `build step "${err.step}" failed (${err.reason})` +
    (tail.length > 0 ? `; last lines of its log:\n${tail.join('\n')}` : '')
  );
}
