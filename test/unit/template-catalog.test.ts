/**
 * How hostd serves templates from their builds (core/template-catalog.ts, through the
 * SandboxManager), against the fake hypervisor and fake images: built templates serve at once,
 * missing ones build in the background one at a time while the others serve, and a template that
 * cannot be built or booted fails alone, with its reason.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { HostdError, type ErrorName } from '../../src/errors.js';
import { RecipeError } from '../../src/core/recipe.js';
import { SandboxManager } from '../../src/core/sandbox-manager.js';
import type { TemplatePlan } from '../../src/core/template-plan.js';
import { FakeHypervisor } from '../helpers/fake-hypervisor.js';
import { FakeImages, fakeImage, plan } from '../helpers/fake-images.js';
import { eventually } from '../../testkit/eventually.js';
import { setupOptions } from '../helpers/manager.js';

function setup(templates: TemplatePlan[], images: FakeImages) {
  const hv = new FakeHypervisor();
  const manager = new SandboxManager(
    { ...setupOptions(), templates, images, forkStandbyMax: 0 },
    hv,
    pino({ level: 'silent' }),
  );
  return { manager, hv, images };
}

async function rejectsWith(p: Promise<unknown>, entry: ErrorName): Promise<HostdError> {
  const caught = await p.then(
    () => assert.fail(`expected ${entry}`),
    (err: unknown) => err,
  );
  assert.ok(caught instanceof HostdError, `not a HostdError: ${String(caught)}`);
  assert.equal(caught.entry, entry);
  return caught;
}

const states = (m: SandboxManager): Record<string, string> =>
  Object.fromEntries(m.listTemplates().map((t) => [t.name, t.state]));

test('built templates serve at start, in configuration order, the first the default, with their build figures', async () => {
  const { manager, hv } = setup(
    [plan('python', { memoryMib: 1024, poolSize: 1 }), plan('slim', { poolSize: 0 })],
    new FakeImages(['python', 'slim']),
  );
  await manager.start();
  const list = manager.listTemplates();
  assert.deepEqual(
    list.map((t) => [t.name, t.default, t.state]),
    [
      ['python', true, 'ready'],
      ['slim', false, 'ready'],
    ],
  );
  const image = fakeImage('python');
  assert.deepEqual(list[0], {
    name: 'python',
    default: true,
    state: 'ready',
    error: null,
    memory_mib: 1024,
    vcpus: 1,
    pool_size: 1,
    disk_mib: image.diskMib,
    description: '',
    preload: [],
    debian_packages: image.debianPackages,
    python_packages: [],
    image_key: image.key,
    built_at: image.builtAt,
  });
  assert.deepEqual(manager.describeTemplate('slim'), list[1]);
  // Each template boots its own image.
  assert.deepEqual(hv.boots, [
    { template: 'python', key: 'key-python' },
    { template: 'slim', key: 'key-slim' },
  ]);
  assert.equal((await manager.create({ template: 'slim' })).info().template, 'slim');
  await manager.shutdown();
});

test('a template not built yet is building while the others serve; creates of it get 503 until it is ready', async () => {
  const images = new FakeImages(['python']);
  images.hold();
  const { manager, hv } = setup([plan('python'), plan('slim', { poolSize: 1 })], images);
  await manager.start();
  await eventually('the build to start', () => images.waiting === 1);
  assert.deepEqual(states(manager), { python: 'ready', slim: 'building' });
  const slim = manager.describeTemplate('slim');
  assert.equal(slim.image_key, null);
  assert.equal(slim.built_at, null);
  const err = await rejectsWith(manager.create({ template: 'slim' }), 'templateUnavailable');
  assert.equal(err.status, 503);
  assert.ok((err.retryAfterS ?? 0) > 0);
  await manager.create({});

  images.release();
  await eventually('slim to be ready', () => states(manager).slim === 'ready');
  assert.deepEqual(hv.boots.at(-1), { template: 'slim', key: 'key-slim' });
  assert.equal(manager.describeTemplate('slim').image_key, 'key-slim');
  assert.equal((await manager.create({ template: 'slim' })).info().template, 'slim');
  await manager.shutdown();
});

test('missing templates are built one at a time, in configuration order', async () => {
  const images = new FakeImages();
  const { manager } = setup([plan('c'), plan('a'), plan('b')], images);
  await manager.start();
  await eventually('every template to be ready', () =>
    Object.values(states(manager)).every((s) => s === 'ready'),
  );
  assert.deepEqual(images.builds, ['c', 'a', 'b']);
  assert.equal(images.mostAtOnce, 1);
  await manager.shutdown();
});

test('a build that fails fails its template with the reason; creates of it get 500 template_failed; the rest serve', async () => {
  const images = new FakeImages(['python']);
  images.failing.set('broken', 'build step "setup command 1 of 1: exit 3" failed (exit status 3)');
  const { manager } = setup([plan('python'), plan('broken'), plan('after')], images);
  await manager.start();
  await eventually('the builds to end', () => states(manager).after !== 'building');
  assert.deepEqual(states(manager), { python: 'ready', broken: 'failed', after: 'ready' });
  const broken = manager.describeTemplate('broken');
  assert.equal(broken.error, images.failing.get('broken'));
  const err = await rejectsWith(manager.create({ template: 'broken' }), 'templateFailed');
  assert.equal(err.status, 500);
  assert.deepEqual(err.params, ['broken', images.failing.get('broken')]);
  await manager.create({ template: 'after' });
  await manager.shutdown();
});

test("a template's build log is the end of its last build's; empty when it has none", async () => {
  const images = new FakeImages(['python']);
  images.logs.set(
    'python',
    'hostd-build-step: debian packages\nE: Unable to locate package nope\n',
  );
  const { manager } = setup([plan('python'), plan('other')], images);
  await manager.start();
  assert.equal(await manager.templateBuildLog('python'), images.logs.get('python'));
  assert.equal(await manager.templateBuildLog('other'), '');
  await rejectsWith(manager.templateBuildLog('nope'), 'templateNotFound');
  await manager.shutdown();
});

test('a recipe that cannot be read fails its template at once, with its message, and is never built', async () => {
  const images = new FakeImages(['python']);
  const bad = new RecipeError('/recipes/bad.toml', 'bad', 'vm.memory_mib', 'must be an integer');
  const { manager } = setup(
    [plan('python'), { name: 'bad', recipe: bad, memoryMib: 512, vcpus: 1, poolSize: 2 }],
    images,
  );
  await manager.start();
  assert.deepEqual(states(manager), { python: 'ready', bad: 'failed' });
  assert.equal(manager.describeTemplate('bad').error, bad.message);
  assert.deepEqual(images.builds, []);
  await rejectsWith(manager.create({ template: 'bad' }), 'templateFailed');
  await manager.shutdown();
});

test('a template whose VM does not boot fails alone', async () => {
  const { manager, hv } = setup([plan('python'), plan('slim')], new FakeImages(['python', 'slim']));
  hv.failingBoots.add('python');
  await manager.start();
  assert.deepEqual(states(manager), { python: 'failed', slim: 'ready' });
  assert.equal(manager.describeTemplate('python').image_key, 'key-python');
  await rejectsWith(manager.create({}), 'templateFailed');
  await manager.create({ template: 'slim' });
  await manager.shutdown();
});

test('an unknown template is template_not_found, for creates and for describe', async () => {
  const { manager } = setup([plan('python')], new FakeImages(['python']));
  await manager.start();
  await rejectsWith(manager.create({ template: 'nope' }), 'templateNotFound');
  assert.throws(
    () => manager.describeTemplate('nope'),
    (err: unknown) => err instanceof HostdError && err.entry === 'templateNotFound',
  );
  await manager.shutdown();
});

test('shutting down stops a build in progress: the template never boots and no machine is left', async () => {
  const images = new FakeImages(['python']);
  images.hold();
  const { manager, hv } = setup([plan('python'), plan('slim')], images);
  await manager.start();
  await eventually('the build to start', () => images.waiting === 1);
  await manager.shutdown();
  assert.deepEqual(
    hv.boots.map((b) => b.template),
    ['python'],
  );
  assert.equal(hv.live.length, 0);
});
