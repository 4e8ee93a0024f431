/**
 * A failed build as API clients read it (GET /v1/templates, 500 template_failed), and a build's
 * log as the console reads it: every host path the build knows named by what it is.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { TemplateBuildError } from '../../src/vm/image/build-step.js';
import { buildLogPath } from '../../src/vm/image/image-builder.js';
import { CachedTemplateImages, clientBuildFailure } from '../../src/vm/image/template-images.js';
import { recipe } from '../helpers/fake-images.js';
import { hostDetailsIn } from '../../testkit/host-details.js';

const CACHE = '/var/cache/hostd';

test('a failed build names the cache directory by its variable and recipe files by their fields', () => {
  const r = recipe(
    'withfiles',
    '[[files]]\nsrc = "data"\ndest = "/opt/data"\n[python]\npackages = ["x"]\nwheels = "wheels"\n',
  );
  const log = `${CACHE}/templates/withfiles/.build-1/build.log`;
  const err = new TemplateBuildError(
    'withfiles',
    'setup command 1 of 1: make',
    log,
    [`cp: cannot stat '/recipes/data/x': No such file`, `wrote ${CACHE}/templates/y`],
    'exit status 1',
  );
  const said = clientBuildFailure(err, r, CACHE);
  assert.deepEqual(hostDetailsIn(said, [CACHE, '/recipes']), [], said);
  assert.ok(said.includes('<files[0].src>/x'), said);
  assert.ok(said.includes('$SERVICE_CACHE_DIR/templates/y'), said);
  const missing = new TemplateBuildError(
    'withfiles',
    'read the recipe',
    null,
    [],
    'files[0].src: /recipes/data does not exist',
  );
  assert.deepEqual(hostDetailsIn(clientBuildFailure(missing, r, CACHE), ['/recipes']), []);
  const fsError = new Error(`EACCES: permission denied, open '${CACHE}/templates/z'`);
  assert.deepEqual(hostDetailsIn(clientBuildFailure(fsError, r, CACHE), [CACHE]), []);
});

test("a build's log, as clients read it, names the cache directory by its variable", async () => {
  const cacheDir = await mkdtemp(join(tmpdir(), 'hostd-build-log-'));
  try {
    const r = recipe('logged');
    const path = buildLogPath(cacheDir, 'logged');
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, `hostd-build-step: boot image\nwrote ${cacheDir}/templates/logged/x\n`);
    const images = new CachedTemplateImages({ cacheDir });
    const said = await images.buildLog(r);
    assert.ok(said !== null);
    assert.deepEqual(hostDetailsIn(said, [cacheDir]), [], said);
    assert.ok(said.includes('$SERVICE_CACHE_DIR/templates/logged/x'), said);
    assert.equal(await images.buildLog(recipe('never-built')), null);
  } finally {
    await rm(cacheDir, { recursive: true, force: true });
  }
});

test("a lookup started ahead is the next find's answer, its failure that find's", async () => {
  const cacheDir = await mkdtemp(join(tmpdir(), 'hostd-look-ahead-'));
  try {
    const images = new CachedTemplateImages({ cacheDir });
    const unbuilt = recipe('unbuilt');
    // /recipes/missing does not exist: hashing the recipe's inputs fails.
    const broken = recipe('broken', '[[files]]\nsrc = "missing"\ndest = "/opt/x"\n');
    images.lookAhead([unbuilt, broken]);
    assert.equal(await images.find(unbuilt), null);
    await assert.rejects(images.find(broken), /files\[0\]\.src/);
    // Taken once: the next find looks again.
    assert.equal(await images.find(unbuilt), null);
  } finally {
    await rm(cacheDir, { recursive: true, force: true });
  }
});
