/**
 * One hostd serves every template from its own build: `python` with the data stack (numpy
 * preloaded), `python-slim` without it, and a user's broken recipes fail only their own
 * templates, with the reason, while the others serve. Needs python and python-slim built
 * (`npm test` builds them first); the broken recipe's build fails in seconds.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BUILTIN_RECIPE_DIR, loadRecipes } from '../../src/core/recipe.js';
import type { TemplateInfo } from '../../src/core/template-catalog.js';
import { defaultCacheDir } from '../../src/config.js';
import { findBuilt } from '../../src/vm/image/image-builder.js';
import type { LoadedImage } from '../../src/vm/image/image.js';
import { eventually } from '../../testkit/eventually.js';
import { run } from '../../testkit/exec.js';
import { startHostd, type ErrorBody, type Hostd } from '../../testkit/hostd.js';
import { createSandbox } from '../../testkit/sandboxes.js';

const cacheDir = defaultCacheDir();
const broken = `test-broken-${process.pid}`;
const unreadable = `test-unreadable-${process.pid}`;
let recipes: string;
let hostd: Hostd;

before(async () => {
  recipes = await mkdtemp(join(tmpdir(), 'hostd-user-recipes-'));
  await writeFile(join(recipes, `${broken}.toml`), 'setup = ["echo breaking; exit 3"]\n');
  await writeFile(join(recipes, `${unreadable}.toml`), '[vm]\nmemory_mib = "lots"\n');
  hostd = await startHostd({
    env: {
      // Unset: every recipe, python first, each with its recipe's resources.
      SERVICE_TEMPLATES: '',
      SERVICE_POOL_SIZE: '',
      SERVICE_TEMPLATE_DIR: recipes,
    },
  });
});

after(async () => {
  await hostd?.stop();
  await rm(recipes, { recursive: true, force: true });
  // What the broken build left in the cache: its log.
  await rm(join(cacheDir, 'templates', broken), { recursive: true, force: true });
  await rm(join(cacheDir, 'templates', `${broken}.lock`), { force: true });
  for (const e of await readdir(join(cacheDir, 'rootfs')).catch(() => [])) {
    if (e.startsWith(`${broken}-`)) await rm(join(cacheDir, 'rootfs', e), { recursive: true });
  }
});

const templates = async (): Promise<TemplateInfo[]> => {
  const res = await hostd.json<{ templates: TemplateInfo[] }>('GET', '/v1/templates');
  assert.equal(res.status, 200);
  return res.body.templates;
};

/** The build of a built-in template, as `npm run template` finds it. */
async function built(name: string): Promise<LoadedImage> {
  const recipe = (await loadRecipes([BUILTIN_RECIPE_DIR])).recipes.find((r) => r.name === name);
  const image = recipe && (await findBuilt(recipe, { cacheDir }));
  assert.ok(image, `${name} is not built: run npm run template -- build ${name}`);
  return image;
}

test('GET /v1/templates lists every recipe, python first and default, each built one ready with its build figures', async () => {
  const list = await templates();
  assert.deepEqual(
    list.map((t) => [t.name, t.default]),
    [
      ['python', true],
      ['python-slim', false],
      [broken, false],
      [unreadable, false],
    ],
  );
  for (const t of list.slice(0, 2)) {
    const { manifest: m } = await built(t.name);
    assert.deepEqual(t, {
      name: m.name,
      default: t.name === 'python',
      state: 'ready',
      error: null,
      memory_mib: m.resources.memory_mib,
      vcpus: m.resources.vcpus,
      pool_size: m.resources.pool_size,
      disk_mib: m.resources.disk_mib,
      description: m.description,
      preload: m.preload,
      debian_packages: m.contents.debian_packages.map((p) => p.name),
      python_packages: m.contents.python_packages.map((p) => p.name),
      image_key: m.key,
      built_at: m.built_at,
    });
    const one = await hostd.json<TemplateInfo>('GET', `/v1/templates/${t.name}`);
    assert.deepEqual([one.status, one.body], [200, t]);
  }
});

test('python runs the data stack with numpy preloaded; python-slim has no numpy', async () => {
  const py = await createSandbox(hostd, { template: 'python' });
  const preloaded = await run(hostd, py, "import sys\nprint('numpy' in sys.modules)");
  assert.deepEqual([preloaded.stdout, preloaded.exit], ['True\n', 0]);
  const pandas = await run(hostd, py, 'import pandas as pd\nprint(int(pd.Series([1, 2]).sum()))');
  assert.deepEqual([pandas.stdout, pandas.exit], ['3\n', 0], pandas.stderr);
  // BLAS and a rendered figure: under TCG, OpenBLAS once chose kernels the emulated CPU lacks.
  const blas = await run(
    hostd,
    py,
    'import numpy as np, io\nimport matplotlib.pyplot as plt\nprint(int((np.ones((64, 64)) @ np.ones((64, 64))).sum()))\nplt.bar([1, 2], [3, 4])\nbuf = io.BytesIO()\nplt.savefig(buf, format="png")\nprint(buf.getvalue()[:4] == b"\\x89PNG")',
  );
  assert.deepEqual([blas.stdout, blas.exit], ['262144\nTrue\n', 0], blas.stderr);

  const slim = await createSandbox(hostd, { template: 'python-slim' });
  const numpy = await run(
    hostd,
    slim,
    'try:\n    import numpy\nexcept ModuleNotFoundError:\n    print("no numpy")',
  );
  assert.deepEqual([numpy.stdout, numpy.exit], ['no numpy\n', 0]);
  for (const id of [py, slim])
    assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
});

test('broken recipes fail only their templates, with the reason; creates of them get 500 template_failed', async () => {
  const failed = await eventually(
    'the broken recipe to fail its build',
    async () => {
      const list = await templates();
      return list.every((t) => t.state !== 'building') ? list : null;
    },
    { timeoutMs: 300_000, everyMs: 500 },
  );
  assert.deepEqual(
    failed.map((t) => [t.name, t.state]),
    [
      ['python', 'ready'],
      ['python-slim', 'ready'],
      [broken, 'failed'],
      [unreadable, 'failed'],
    ],
  );
  // The broken one's log holds what its failing step printed, past the lines `error` quotes.
  const log = await hostd.request('GET', `/v1/templates/${broken}/log`);
  assert.equal(log.status, 200);
  assert.match(log.headers.get('content-type') ?? '', /^text\/plain/);
  assert.match(await log.text(), /^breaking$/m);
  const none = await hostd.request('GET', `/v1/templates/${unreadable}/log`);
  assert.deepEqual([none.status, await none.text()], [200, '']);
  const unknown = await hostd.json<ErrorBody>('GET', '/v1/templates/no-such-template/log');
  assert.deepEqual([unknown.status, unknown.body.code], [404, 'template_not_found']);
  for (const t of failed.slice(2)) {
    assert.equal(typeof t.error, 'string');
    assert.ok(t.error!.length > 0);
    assert.equal(t.image_key, null);
    const create = await hostd.json<ErrorBody>('POST', '/v1/sandboxes', { template: t.name });
    assert.deepEqual([create.status, create.body.code], [500, 'template_failed']);
  }
  // The others still serve.
  const id = await createSandbox(hostd, {});
  assert.equal((await run(hostd, id, 'print(6 * 7)')).stdout, '42\n');
  assert.equal((await hostd.request('DELETE', `/v1/sandboxes/${id}`)).status, 204);
});
