/**
 * The template builder against the real scripts and cache: failures name their step and keep
 * their log, a finished build is found again, and a change to a recipe's files rebuilds the
 * root filesystem on top of the cached Debian packages, and a build stopped half-way leaves
 * nothing behind. Recipes here use only the base packages, which `npm test` has installed for
 * python-slim already, so each build takes seconds; the one that adds a package is stopped.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, readlink, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseRecipe, type Recipe } from '../../src/core/recipe.js';
import { TemplateBuildError } from '../../src/vm/image/build-step.js';
import { defaultCacheDir } from '../../src/config.js';
import { buildTemplate, findBuilt } from '../../src/vm/image/image-builder.js';

const cacheDir = defaultCacheDir();
const recipes = await mkdtemp(join(tmpdir(), 'hostd-recipes-'));
const names: string[] = [];

/** A recipe in a fresh directory, under a name no other test run uses. */
async function recipe(base: string, text: string, files: Record<string, string> = {}) {
  const name = `test-${base}-${process.pid}`;
  names.push(name);
  for (const [path, content] of Object.entries(files))
    await writeFile(join(recipes, path), content);
  return parseRecipe(text, join(recipes, `${name}.toml`));
}

const entries = (dir: string): Promise<string[]> => readdir(dir).catch(() => []);

/** The cached root filesystems of template `name`, finished or not (`.tmp.`). */
const rootfsEntriesOf = async (name: string): Promise<string[]> =>
  (await entries(join(cacheDir, 'rootfs'))).filter((e) => e.startsWith(`${name}-`));

/** A package no template installs: a package set with it is not cached, so mmdebstrap runs. */
const UNCACHED_PACKAGE = 'hello';

/** Every process whose root, working directory or command line is under `dir`. */
async function processesUnder(dir: string): Promise<string[]> {
  const found: string[] = [];
  for (const pid of (await entries('/proc')).filter((e) => /^\d+$/.test(e))) {
    const at = (what: string): Promise<string> => readlink(`/proc/${pid}/${what}`).catch(() => '');
    const cmd = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    const root = await at('root');
    const cwd = await at('cwd');
    if ([root, cwd].some((p) => p.startsWith(dir)) || cmd.includes(dir))
      found.push(`${pid}: ${cmd.replaceAll('\0', ' ')}`);
  }
  return found;
}

/** Mount points of this namespace under `dir`, or in a directory mmdebstrap made. */
async function mountsUnder(dir: string): Promise<string[]> {
  const lines = (await readFile('/proc/self/mountinfo', 'utf8')).split('\n');
  return lines.filter((l) => l.split(' ')[4]?.startsWith(dir) || l.includes('/mmdebstrap.'));
}

/** Builds `r` and stops the build at the first log line that `stopAt` accepts. */
async function stopBuild(r: Recipe, stopAt: (line: string) => boolean): Promise<void> {
  const stop = new AbortController();
  const onLine = (line: string): void => {
    if (stopAt(line)) stop.abort();
  };
  const err = await buildTemplate(r, { cacheDir, onLine, signal: stop.signal }).then(
    () => assert.fail('the build was not stopped'),
    (e: unknown) => e,
  );
  assert.ok(stop.signal.aborted, String(err));
  assert.ok(err instanceof TemplateBuildError, String(err));
  assert.equal(err.reason, 'cancelled');
}

after(async () => {
  for (const name of names) {
    await rm(join(cacheDir, 'templates', name), { recursive: true, force: true });
    await rm(join(cacheDir, 'templates', `${name}.lock`), { force: true });
    for (const e of await rootfsEntriesOf(name))
      await rm(join(cacheDir, 'rootfs', e), { recursive: true, force: true });
  }
  // A stopped build that was not stopped in time would leave its package set cached, and the
  // next run would find nothing to stop.
  const debianDir = join(cacheDir, 'debian');
  for (const e of await entries(debianDir)) {
    const lock = await readFile(join(debianDir, e, 'packages.lock'), 'utf8').catch(() => '');
    if (lock.split('\n').some((l) => l.startsWith(`${UNCACHED_PACKAGE}=`)))
      await rm(join(debianDir, e), { recursive: true, force: true });
  }
  await rm(recipes, { recursive: true, force: true });
});

test('a failing setup command fails the build at that command, with the end of the log, which stays', async () => {
  const r = await recipe('broken', 'setup = ["echo about to fail", "echo failing; exit 3"]\n');
  const err = await buildTemplate(r, { cacheDir }).then(
    () => assert.fail('the build succeeded'),
    (e: unknown) => e,
  );
  assert.ok(err instanceof TemplateBuildError);
  assert.equal(err.template, r.name);
  assert.equal(err.step, 'setup command 2 of 2: echo failing; exit 3');
  assert.ok(err.tail.includes('failing'), err.tail.join('\n'));
  assert.ok(err.logPath !== null);
  assert.ok((await readFile(err.logPath, 'utf8')).includes('about to fail'));
  // Nothing of the failed build is left but its log.
  assert.deepEqual(await rootfsEntriesOf(r.name), []);
  assert.equal(await findBuilt(r, { cacheDir }), null);
});

test('a missing file fails the build naming the recipe field', async () => {
  const r = await recipe('missing', '[[files]]\nsrc = "nowhere.txt"\ndest = "/etc/x"\n');
  const err = await buildTemplate(r, { cacheDir }).catch((e: unknown) => e);
  assert.ok(err instanceof TemplateBuildError);
  assert.equal(err.step, 'read the recipe');
  assert.equal(err.reason, `files[0].src: ${join(recipes, 'nowhere.txt')} does not exist`);
});

test('a built template is found again; changing a file rebuilds its root filesystem, not its packages', async () => {
  const text = '[[files]]\nsrc = "motd"\ndest = "/etc/motd"\n';
  const first = await recipe('files', text, { motd: 'one\n' });
  const built = await buildTemplate(first, { cacheDir });
  assert.equal(built.manifest.name, first.name);
  assert.deepEqual(built.manifest.resources, {
    memory_mib: 512,
    vcpus: 1,
    pool_size: 2,
    disk_mib: 4096,
  });

  const again = await buildTemplate(first, { cacheDir });
  assert.equal(again.built, false);
  assert.equal(again.dir, built.dir);
  assert.equal((await findBuilt(first, { cacheDir }))?.dir, built.dir);

  const debianBefore = await entries(join(cacheDir, 'debian'));
  await writeFile(join(recipes, 'motd'), 'two\n');
  const changed = await buildTemplate(parseRecipe(text, first.file), { cacheDir });
  assert.equal(changed.built, true);
  assert.notEqual(changed.manifest.keys.rootfs, built.manifest.keys.rootfs);
  assert.equal(changed.manifest.keys.boot, built.manifest.keys.boot);
  assert.deepEqual(await entries(join(cacheDir, 'debian')), debianBefore);
});

test('a build stopped in a setup command leaves nothing running, mounted or on disk', async () => {
  const marker = `setup-running-${process.pid}`;
  const r = await recipe('stopped-setup', `setup = ["echo ${marker}; sleep 3600"]\n`);
  await stopBuild(r, (line) => line.includes(marker) && !line.includes('echo'));
  const rootfsDir = join(cacheDir, 'rootfs', r.name);
  assert.deepEqual(await processesUnder(rootfsDir), []);
  assert.deepEqual(await mountsUnder(rootfsDir), []);
  assert.deepEqual(await rootfsEntriesOf(r.name), []);
});

test('a build stopped while it installs Debian packages leaves nothing running, mounted or on disk', async () => {
  const r = await recipe('stopped-debian', `[debian]\npackages = ["${UNCACHED_PACKAGE}"]\n`);
  const debianDir = join(cacheDir, 'debian');
  const tmpBefore = (await entries(tmpdir())).filter((e) => e.startsWith('mmdebstrap.'));
  // Once mmdebstrap installs the essential packages, its chroot's mounts are in place.
  let installing = false;
  await stopBuild(r, (line) => {
    installing ||= line.includes('installing essential packages');
    return installing && line.startsWith('Setting up ');
  });
  assert.deepEqual(await processesUnder(debianDir), []);
  assert.deepEqual(await mountsUnder(debianDir), []);
  assert.deepEqual(
    (await entries(debianDir)).filter((e) => e.includes('.tmp.')),
    [],
  );
  assert.deepEqual(
    (await entries(tmpdir())).filter((e) => e.startsWith('mmdebstrap.') && !tmpBefore.includes(e)),
    [],
  );
});
