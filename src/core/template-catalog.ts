/**
 * The templates hostd serves and where each one is: `building` (its image is being built, or
 * its template VM booted), `ready` (its warm pool serves creates) or `failed` (with the reason:
 * a recipe that cannot be read, a build step and the end of its log, a VM that would not boot).
 * Templates already built are booted at start; the others are built in the background, one at
 * a time (they compete for the same CPUs and the same package cache), while the rest serve.
 */
import type { Logger } from 'pino';
import { fail } from '../errors.js';
import type { FrozenState, TemplateImage, TemplateImages } from '../vm/machine.js';
import { clientReason, logMachineFailure } from './machine-error.js';
import type { TemplatePool } from './pool.js';
import { RECIPE_DEFAULTS, RecipeError, type Recipe } from './recipe.js';
import type { TemplatePlan } from './template-plan.js';

export type TemplateState = 'building' | 'ready' | 'failed';

/** A template as `GET /v1/templates` shows it (docs/api.md, Templates). */
export interface TemplateInfo {
  name: string;
  default: boolean;
  state: TemplateState;
  error: string | null;
  memory_mib: number;
  vcpus: number;
  pool_size: number;
  disk_mib: number;
  description: string;
  preload: string[];
  debian_packages: string[];
  python_packages: string[];
  image_key: string | null;
  built_at: string | null;
}

/** Makes the warm pool of a template once its image is built. */
export type PoolFactory = (plan: TemplatePlan, image: TemplateImage) => TemplatePool;

interface Entry {
  readonly plan: TemplatePlan;
  state: TemplateState;
  error: string | null;
  image: TemplateImage | null;
  pool: TemplatePool | null;
}

export class TemplateCatalog {
  private readonly entries = new Map<string, Entry>();
  /** Templates whose image must be built, in configuration order. */
  private readonly toBuild: Entry[] = [];
  private builder: Promise<void> | null = null;
  private readonly stop = new AbortController();

  constructor(
    plans: readonly TemplatePlan[],
    private readonly images: TemplateImages,
    private readonly makePool: PoolFactory,
    /** Called with each template's frozen state once it serves (fork standby registers it). */
    private readonly onReady: (name: string, state: FrozenState) => void,
    private readonly log: Logger,
  ) {
    for (const plan of plans) {
      const failed = plan.recipe instanceof RecipeError ? plan.recipe.message : null;
      this.entries.set(plan.name, {
        plan,
        state: failed === null ? 'building' : 'failed',
        error: failed,
        image: null,
        pool: null,
      });
    }
  }

  /** The template creates without a name get: the first configured. */
  get defaultName(): string | undefined {
    return this.entries.keys().next().value;
  }

  /**
   * Boots every template whose image the cache holds (in turn: they compete for the CPUs), and
   * notes the others for `buildMissing`. A template that fails to boot fails alone.
   */
  async start(): Promise<void> {
    for (const entry of this.entries.values()) {
      const recipe = entry.plan.recipe;
      if (recipe instanceof RecipeError) {
        this.log.error({ template: entry.plan.name, why: recipe.message }, 'template failed');
        continue;
      }
      const image = await this.images.find(recipe).catch((err: unknown) => {
        this.log.warn({ template: entry.plan.name, err }, 'could not look up the build');
        return null;
      });
      if (image) await this.boot(entry, image);
      else this.toBuild.push(entry);
    }
  }

  /**
   * Starts building, in the background and one at a time, the templates `start` found unbuilt;
   * each boots as soon as it is built. Call after `start`, once nothing else writes the
   * hypervisor's state directory.
   */
  buildMissing(): void {
    if (this.builder || this.toBuild.length === 0) return;
    this.builder = (async () => {
      for (let entry = this.toBuild.shift(); entry; entry = this.toBuild.shift()) {
        if (this.stop.signal.aborted) return;
        await this.build(entry);
      }
    })();
  }

  /**
   * The pool of a template that serves. Unknown: 404 template_not_found; still building:
   * 503 template_unavailable (retry later); failed: 500 template_failed with the reason.
   */
  pool(name: string): TemplatePool {
    const entry = this.entries.get(name);
    if (!entry) throw fail('templateNotFound', name, [...this.entries.keys()]);
    if (entry.state === 'failed') throw fail('templateFailed', name, entry.error ?? 'unknown');
    if (!entry.pool) throw fail('templateUnavailable', name, 'its image is being built');
    return entry.pool;
  }

  /** Pools of the templates that serve, in configuration order. */
  pools(): TemplatePool[] {
    return [...this.entries.values()].flatMap((e) => (e.pool ? [e.pool] : []));
  }

  list(): TemplateInfo[] {
    return [...this.entries.values()].map((e) => this.info(e));
  }

  /** One template; 404 template_not_found when hostd serves none by that name. */
  describe(name: string): TemplateInfo {
    const entry = this.entries.get(name);
    if (!entry) throw fail('templateNotFound', name, [...this.entries.keys()]);
    return this.info(entry);
  }

  /**
   * The end of the template's last build log ('' when it has none: never built here, or its
   * recipe could not be read); 404 template_not_found for an unknown name.
   */
  async buildLog(name: string): Promise<string> {
    const entry = this.entries.get(name);
    if (!entry) throw fail('templateNotFound', name, [...this.entries.keys()]);
    const { recipe } = entry.plan;
    if (recipe instanceof RecipeError) return '';
    return (await this.images.buildLog(recipe)) ?? '';
  }

  /** Stops the build in progress (its scripts are killed) and the ones waiting; idempotent. */
  stopBuilding(): void {
    this.stop.abort();
    this.toBuild.length = 0;
  }

  /** Stops building, waits for a boot in progress, closes the pools. */
  async close(): Promise<void> {
    this.stopBuilding();
    await this.builder;
    await Promise.all(this.pools().map((p) => p.close()));
  }

  private async build(entry: Entry): Promise<void> {
    const { name } = entry.plan;
    const started = Date.now();
    this.log.info({ template: name }, 'building the template image');
    let image: TemplateImage;
    try {
      image = await this.images.build(entry.plan.recipe as Recipe, this.stop.signal);
    } catch (err) {
      if (this.stop.signal.aborted) return;
      // The image layer's message is for clients (the step and the end of its log, without
      // host paths: TemplateImages.build); the log gets the error whole.
      this.log.error({ template: name, err }, 'template build failed');
      this.failed(entry, err instanceof Error ? err.message : String(err));
      return;
    }
    this.log.info({ template: name, buildMs: Date.now() - started }, 'template image built');
    if (!this.stop.signal.aborted) await this.boot(entry, image);
  }

  private async boot(entry: Entry, image: TemplateImage): Promise<void> {
    entry.image = image;
    const pool = this.makePool(entry.plan, image);
    let state: FrozenState;
    try {
      state = await pool.init();
    } catch (err) {
      await pool.close();
      logMachineFailure(this.log, err, { template: entry.plan.name }, 'boot the template');
      this.failed(entry, `its VM failed to boot: ${clientReason(err)}`);
      return;
    }
    if (this.stop.signal.aborted) {
      await pool.close();
      return;
    }
    entry.pool = pool;
    entry.state = 'ready';
    this.onReady(entry.plan.name, state);
  }

  private failed(entry: Entry, why: string): void {
    entry.state = 'failed';
    entry.error = why;
    this.log.error({ template: entry.plan.name, why }, 'template failed');
  }

  private info(e: Entry): TemplateInfo {
    const { plan, image } = e;
    const recipe = plan.recipe instanceof RecipeError ? null : plan.recipe;
    return {
      name: plan.name,
      default: plan.name === this.defaultName,
      state: e.state,
      error: e.error,
      memory_mib: plan.memoryMib,
      vcpus: plan.vcpus,
      pool_size: plan.poolSize,
      disk_mib: image?.diskMib ?? recipe?.vm.diskMib ?? RECIPE_DEFAULTS.diskMib,
      description: recipe?.description ?? '',
      preload: [...(recipe?.preload ?? [])],
      debian_packages: [...(image?.debianPackages ?? recipe?.debianPackages ?? [])],
      python_packages: [...(image?.pythonPackages ?? recipe?.python.packages ?? [])],
      image_key: image?.key ?? null,
      built_at: image?.builtAt ?? null,
    };
  }
}
