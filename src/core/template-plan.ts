/**
 * Which templates hostd serves, from what recipe, with what resources: the recipes of templates/
 * and SERVICE_TEMPLATE_DIR are the catalog, SERVICE_TEMPLATES picks and orders what is served
 * and may override resources (docs/operations.md). Pure, so the rules are unit-tested without a
 * file system.
 */
import { RECIPE_DEFAULTS, RecipeError, type Recipe, type RecipeCatalog } from './recipe.js';

/** The template that comes first (the default) when configuration does not say. */
export const DEFAULT_TEMPLATE = 'python';

/** Resources that configuration may impose over a recipe's `[vm]` section. */
export interface ResourceOverrides {
  readonly memoryMib?: number;
  readonly vcpus?: number;
  readonly poolSize?: number;
}

/** One entry of SERVICE_TEMPLATES: a template to serve, and what it overrides. */
export interface TemplateChoice extends ResourceOverrides {
  readonly name: string;
  /** The recipe it is served from, when not the one of its own name (a second pool of a build). */
  readonly recipe?: string;
}

/** A template hostd serves: its recipe (or why it has none usable) and its machines' resources. */
export interface TemplatePlan {
  readonly name: string;
  readonly recipe: Recipe | RecipeError;
  readonly memoryMib: number;
  readonly vcpus: number;
  readonly poolSize: number;
}

/** Configuration naming a template that no recipe defines: hostd refuses to start. */
export class UnknownRecipeError extends Error {
  constructor(
    readonly template: string,
    readonly recipe: string,
    readonly known: readonly string[],
  ) {
    super(
      `SERVICE_TEMPLATES: no recipe ${recipe}.toml for template "${template}" in templates/ or SERVICE_TEMPLATE_DIR (recipes: ${known.join(', ') || 'none'})`,
    );
    this.name = 'UnknownRecipeError';
  }
}

/**
 * The templates to serve, in order (the first is the default). Without `choices`, every recipe,
 * `python` first. Resources: a choice's own options, else `overrides` (the global
 * SERVICE_VM_* and SERVICE_POOL_SIZE, when set), else the recipe's `[vm]`. A recipe that could
 * not be read keeps its place and fails only its template. Throws UnknownRecipeError.
 *
 * @example planTemplates(catalog, [{ name: 'python', poolSize: 4 }], {})[0].poolSize // 4
 */
export function planTemplates(
  catalog: RecipeCatalog,
  choices: readonly TemplateChoice[] | null,
  overrides: ResourceOverrides,
): TemplatePlan[] {
  const byName = new Map<string, Recipe | RecipeError>();
  for (const r of [...catalog.recipes, ...catalog.errors]) byName.set(nameOf(r), r);
  const all = [...byName.keys()];
  const picked: readonly TemplateChoice[] =
    choices ??
    [
      ...all.filter((n) => n === DEFAULT_TEMPLATE),
      ...all.filter((n) => n !== DEFAULT_TEMPLATE),
    ].map((name) => ({ name }));
  return picked.map((choice) => {
    const recipeName = choice.recipe ?? choice.name;
    const recipe = byName.get(recipeName);
    if (!recipe) throw new UnknownRecipeError(choice.name, recipeName, all);
    const vm = recipe instanceof RecipeError ? RECIPE_DEFAULTS : recipe.vm;
    return {
      name: choice.name,
      recipe,
      memoryMib: choice.memoryMib ?? overrides.memoryMib ?? vm.memoryMib,
      vcpus: choice.vcpus ?? overrides.vcpus ?? vm.vcpus,
      poolSize: choice.poolSize ?? overrides.poolSize ?? vm.poolSize,
    };
  });
}

const nameOf = (r: Recipe | RecipeError): string =>
  r instanceof RecipeError ? r.template : r.name;
