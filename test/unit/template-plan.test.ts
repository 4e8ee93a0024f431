/**
 * Which templates hostd serves and with what resources (core/template-plan.ts): the recipes are
 * the catalog, SERVICE_TEMPLATES selects, orders and overrides.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RECIPE_DEFAULTS, RecipeError, type RecipeCatalog } from '../../src/core/recipe.js';
import { planTemplates, UnknownRecipeError } from '../../src/core/template-plan.js';
import { recipe } from '../helpers/fake-images.js';

const broken = new RecipeError('/recipes/broken.toml', 'broken', null, 'is not valid TOML');
const catalog: RecipeCatalog = {
  recipes: [
    recipe('alpha', '[vm]\nmemory_mib = 256\npool_size = 0\n'),
    recipe('python', '[vm]\nmemory_mib = 1024\nvcpus = 2\npool_size = 3\n'),
    recipe('python-slim'),
  ],
  errors: [broken],
};

const summary = (plans: ReturnType<typeof planTemplates>) =>
  plans.map((p) => [p.name, p.memoryMib, p.vcpus, p.poolSize]);

test('unset: every recipe is served, python first, with its own [vm] resources', () => {
  const plans = planTemplates(catalog, null, {});
  assert.deepEqual(summary(plans), [
    ['python', 1024, 2, 3],
    ['alpha', 256, 1, 0],
    ['python-slim', RECIPE_DEFAULTS.memoryMib, RECIPE_DEFAULTS.vcpus, RECIPE_DEFAULTS.poolSize],
    ['broken', RECIPE_DEFAULTS.memoryMib, RECIPE_DEFAULTS.vcpus, RECIPE_DEFAULTS.poolSize],
  ]);
  // A recipe that could not be read keeps its place and carries its error.
  assert.equal(plans[3]!.recipe, broken);
});

test('SERVICE_TEMPLATES selects and orders; its options beat the global overrides, which beat the recipe', () => {
  const plans = planTemplates(catalog, [{ name: 'python-slim', poolSize: 5 }, { name: 'python' }], {
    memoryMib: 768,
  });
  assert.deepEqual(summary(plans), [
    ['python-slim', 768, 1, 5],
    ['python', 768, 2, 3],
  ]);
});

test('recipe= serves a second pool of another template build', () => {
  const [python, cold] = planTemplates(
    catalog,
    [{ name: 'python' }, { name: 'cold', recipe: 'python', poolSize: 0 }],
    {},
  );
  assert.equal(cold!.recipe, python!.recipe);
  assert.deepEqual(summary([cold!]), [['cold', 1024, 2, 0]]);
});

test('a template no recipe defines stops hostd from starting, naming it', () => {
  assert.throws(
    () => planTemplates(catalog, [{ name: 'python' }, { name: 'pyhton' }], {}),
    (err: unknown) =>
      err instanceof UnknownRecipeError && err.template === 'pyhton' && err.recipe === 'pyhton',
  );
});
