/**
 * An in-memory TemplateImages (src/vm/machine.ts) for unit tests of core's template catalog:
 * which templates are "in the cache", which builds fail and why, and builds that wait until the
 * test lets them go, so that a test can look at a template while it is building.
 */
import { parseRecipe, type Recipe } from '../../src/core/recipe.js';
import type { TemplatePlan } from '../../src/core/template-plan.js';
import type { TemplateImage, TemplateImages } from '../../src/vm/machine.js';
import type { TemplateSpec } from '../../src/vm/image/image-builder.js';

/** The image a fake build of `name` gives; `variant` makes another build of it (another key). */
export function fakeImage(name: string, variant = ''): TemplateImage {
  return {
    key: `key-${name}${variant}`,
    builtAt: '2026-11-23T10:00:00Z',
    diskMib: 4096,
    debianPackages: ['python3-minimal', `${name}-package`],
    pythonPackages: [],
    preload: [],
    warmup: '',
  };
}

/** A recipe named `name` parsed from `text` (TOML), as if it were `/recipes/NAME.toml`. */
export function recipe(name: string, text = ''): Recipe {
  return parseRecipe(text, `/recipes/${name}.toml`);
}

/** A template served from its own recipe with these resources. */
export function plan(
  name: string,
  resources: { memoryMib?: number; vcpus?: number; poolSize?: number } = {},
): TemplatePlan {
  return { name, recipe: recipe(name), memoryMib: 512, vcpus: 1, poolSize: 2, ...resources };
}

export class FakeImages implements TemplateImages {
  /** Templates (by recipe name) whose image the cache holds. */
  readonly built: Set<string>;
  /** Builds that fail, and the reason they give. */
  readonly failing = new Map<string, string>();
  /** Every build started, in order. */
  readonly builds: string[] = [];
  /** Builds running now. */
  running = 0;
  /** Most builds that ran at once. */
  mostAtOnce = 0;
  private held: (() => void)[] | null = null;

  constructor(
    built: readonly string[] = [],
    /** What this cache's builds' keys end with: two caches with other variants differ. */
    private readonly variant = '',
  ) {
    this.built = new Set(built);
  }

  async find(spec: TemplateSpec): Promise<TemplateImage | null> {
    return this.built.has(spec.name) ? fakeImage(spec.name, this.variant) : null;
  }

  /** Build logs by template name, as `buildLog` returns them. */
  readonly logs = new Map<string, string>();

  async buildLog(spec: TemplateSpec): Promise<string | null> {
    return this.logs.get(spec.name) ?? null;
  }

  async build(spec: TemplateSpec, signal: AbortSignal): Promise<TemplateImage> {
    this.builds.push(spec.name);
    this.running++;
    this.mostAtOnce = Math.max(this.mostAtOnce, this.running);
    try {
      const held = this.held;
      // A real build's scripts are killed when it is stopped: it ends at once.
      if (held) {
        await new Promise<void>((r) => {
          held.push(r);
          signal.addEventListener('abort', () => r());
        });
      }
      if (signal.aborted) throw new Error('the build was stopped');
      const why = this.failing.get(spec.name);
      if (why !== undefined) throw new Error(why);
      this.built.add(spec.name);
      return fakeImage(spec.name, this.variant);
    } finally {
      this.running--;
    }
  }

  /** Makes builds wait until `release`. */
  hold(): void {
    this.held ??= [];
  }

  /** Lets waiting builds go on, and later ones pass. */
  release(): void {
    const waiting = this.held ?? [];
    this.held = null;
    waiting.forEach((w) => w());
  }

  /** How many builds wait for `release`. */
  get waiting(): number {
    return this.held?.length ?? 0;
  }
}
