/**
 * A fork point copied from a template's image (a snapshot of a sandbox made from a template, the
 * origin of a fork's children) is made durable as a page delta against that image, which is
 * durable already, instead of as the whole copy, most of it still dirty in the page cache: the
 * image itself is synced later, off the request, and the delta then goes; reopened while the
 * delta is there, the image is made again from the template's and the delta (real files, no
 * QEMU; the fsyncs recorded).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { access, mkdir, mkdtemp, open, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { MachineSpec } from '../../src/vm/qemu/qemu-args.js';
import type { QemuState } from '../../src/vm/qemu/qemu-state.js';
import { StateStore } from '../../src/vm/qemu/state-store.js';
import type { Syncer } from '../../src/vm/storage/durable.js';
import { MemImage } from '../../src/vm/storage/mem-image.js';
import { STATE_FORMAT } from '../../src/vm/storage/state-format.js';
import { eventually } from '../../testkit/eventually.js';
import { templateBuild } from '../helpers/template-build.js';

const KEY = 'abcdef0123456789abcdef01';
const PAGE = 4096;
let root: string;
let spec: MachineSpec;

/** Records each fsync (relative to `root`) and does none. */
function recordingSyncer(): Syncer & { synced: string[] } {
  const synced: string[] = [];
  const note = (p: string): Promise<void> => {
    synced.push(p.slice(root.length + 1));
    return Promise.resolve();
  };
  return { synced, file: note, dir: note };
}

async function newStore(name: string, syncer: Syncer, settleMs: number): Promise<StateStore> {
  const store = new StateStore(join(root, name), undefined, join(root, 'cache'), syncer, settleMs);
  await store.init();
  return store;
}

/** The template frozen in `store`: 1 MiB of RAM, its second half zero (a hole). */
async function frozenTemplate(store: StateStore): Promise<QemuState> {
  const dir = join(store.templatesDir, KEY);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'memory.img'), randomBytes(512 * 1024));
  const fh = await open(join(dir, 'memory.img'), 'r+');
  await fh.truncate(1024 * 1024);
  await fh.close();
  await writeFile(join(dir, 'device.state'), randomBytes(2000));
  await writeFile(join(dir, 'complete'), '1\n');
  const state = await store.cachedTemplate(KEY, spec);
  assert.ok(state);
  return state;
}

/**
 * A capture of a machine restored from `base`, as Vm.captureState makes one: a copy of its
 * image with the pages the machine wrote (pages 3-4 and 200) at their offsets.
 */
async function captureOver(store: StateStore, base: QemuState): Promise<QemuState> {
  const path = store.newImagePath('fork');
  await MemImage.copy(base.image.path, path);
  const runs: Array<[number, number]> = [
    [3, 2],
    [200, 1],
  ];
  const fh = await open(path, 'r+');
  for (const [first, count] of runs)
    await fh.write(randomBytes(count * PAGE), 0, count * PAGE, first * PAGE);
  await fh.close();
  const state = await store.addFork(path, spec, randomBytes(800), null, [], { base, runs });
  return state.retain();
}

describe('a fork point over a template image is durable as its page delta', () => {
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'hostd-state-delta-'));
    spec = await templateBuild(join(root, 'cache'), '0123456789abcdef', {
      memoryMib: 1,
      disk: false,
    });
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('syncs the delta, device state and record with the template, never the image copy', async () => {
    const syncer = recordingSyncer();
    const store = await newStore('snap', syncer, 3_600_000);
    const state = await captureOver(store, await frozenTemplate(store));
    await store.persistState(state);
    assert.deepEqual(syncer.synced.sort(), [
      'snap/images',
      `snap/images/${state.id}.delta`,
      `snap/images/${state.id}.json`,
      `snap/images/${state.id}.state`,
      'snap/templates',
      `snap/templates/${KEY}`,
      `snap/templates/${KEY}/complete`,
      `snap/templates/${KEY}/device.state`,
      `snap/templates/${KEY}/memory.img`,
    ]);
    // The delta holds the three written pages and their table, nothing of the copy's rest.
    const delta = await readFile(join(store.imagesDir, `${state.id}.delta`));
    assert.equal(delta.length, 16 + 3 * PAGE + 2 * 8);
    state.release();
  });

  it('syncs the image once it has waited, then removes the delta', async () => {
    const syncer = recordingSyncer();
    const store = await newStore('settle', syncer, 0);
    const state = await captureOver(store, await frozenTemplate(store));
    const delta = join(store.imagesDir, `${state.id}.delta`);
    await store.persistState(state);
    assert.ok(!syncer.synced.includes(`settle/images/${state.id}.mem`));
    await eventually('the delta removed', () => !existsSync(delta));
    assert.ok(syncer.synced.includes(`settle/images/${state.id}.mem`), 'the image synced first');
    assert.equal(state.delta, null);
    syncer.synced.length = 0;
    await store.persistState(state);
    assert.deepEqual(syncer.synced, [], 'durable, it is not synced again');
    state.release();
  });

  it('a pause of a child of the fork syncs its origin as the delta too', async () => {
    const syncer = recordingSyncer();
    const store = await newStore('pause', syncer, 3_600_000);
    const origin = await captureOver(store, await frozenTemplate(store));
    const { dir } = await store.newPausedDir();
    await writeFile(join(dir, 'memory.delta'), randomBytes(100));
    await store.persistPaused([join(dir, 'memory.delta')], [store.pausedDir], origin, null);
    assert.ok(syncer.synced.includes(`pause/images/${origin.id}.delta`));
    assert.ok(!syncer.synced.includes(`pause/images/${origin.id}.mem`));
    origin.release();
  });

  it('reopened while its delta is there, its image is made again from the template and the delta', async () => {
    const syncer = recordingSyncer();
    const store = await newStore('crash', syncer, 3_600_000);
    const state = await captureOver(store, await frozenTemplate(store));
    await store.persistState(state);
    const image = join(store.imagesDir, `${state.id}.mem`);
    const want = await readFile(image);
    // What a power cut may leave of an image that was never synced, and a host booted again.
    await writeFile(image, Buffer.alloc(100));
    const record = join(store.imagesDir, `${state.id}.json`);
    const meta = JSON.parse(await readFile(record, 'utf8')) as Record<string, unknown>;
    await writeFile(record, JSON.stringify({ ...meta, boot: 'an-earlier-boot' }));
    const again = await newStore('crash', recordingSyncer(), 3_600_000);
    const reopened = await again.open({ format: STATE_FORMAT, id: state.id, spec });
    assert.ok((await readFile(image)).equals(want));
    assert.equal(reopened.delta?.base.id, `template-${KEY}`);
    assert.ok(!existsSync(`${image}.part`));
    const rebuilt = JSON.parse(await readFile(record, 'utf8')) as Record<string, unknown>;
    assert.notEqual(rebuilt.boot, 'an-earlier-boot', 'made in this boot: not made again in it');
  });

  it('reopened in the same boot (hostd restarted), its image is kept: QEMUs from before may map it', async () => {
    const store = await newStore('restart', recordingSyncer(), 3_600_000);
    const state = await captureOver(store, await frozenTemplate(store));
    await store.persistState(state);
    const image = join(store.imagesDir, `${state.id}.mem`);
    const inode = (await stat(image)).ino;
    const again = await newStore('restart', recordingSyncer(), 3_600_000);
    const reopened = await again.open({ format: STATE_FORMAT, id: state.id, spec });
    assert.equal((await stat(image)).ino, inode, 'the same file, not one made again');
    assert.equal(reopened.delta?.base.id, `template-${KEY}`, 'still durable as its delta');
  });

  it('a fork point over another fork point is synced whole, as before', async () => {
    const syncer = recordingSyncer();
    const store = await newStore('chain', syncer, 3_600_000);
    const first = await captureOver(store, await frozenTemplate(store));
    const second = await captureOver(store, first);
    await store.persistState(second);
    assert.ok(syncer.synced.includes(`chain/images/${second.id}.mem`));
    assert.ok(!existsSync(join(store.imagesDir, `${second.id}.delta`)));
    second.release();
    first.release();
  });
});

describe('a fork point whose image settles while a pause syncs it as its delta', () => {
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'hostd-state-delta-race-'));
    spec = await templateBuild(join(root, 'cache'), '0123456789abcdef', {
      memoryMib: 1,
      disk: false,
    });
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('the pause is durable (its origin synced whole), not failed: a failed pause loses its sandbox', async () => {
    const first = await newStore('race', recordingSyncer(), 3_600_000);
    const state = await captureOver(first, await frozenTemplate(first));
    await first.persistState(state);
    const deltaPath = join(first.imagesDir, `${state.id}.delta`);
    // hostd restarted in the same boot: the delta is kept and its settle is due at once. The
    // fsyncs wait on a busy thread pool (held here), and each opens its file as a real one does.
    let releaseImage = (): void => undefined;
    const imageHeld = new Promise<void>((r) => (releaseImage = r));
    let releaseDelta = (): void => undefined;
    const deltaHeld = new Promise<void>((r) => (releaseDelta = r));
    const seen: string[] = [];
    const syncer: Syncer = {
      file: async (p) => {
        seen.push(p);
        if (p.endsWith('.mem')) await imageHeld;
        if (p.endsWith('.delta')) await deltaHeld;
        await access(p);
      },
      dir: () => Promise.resolve(),
    };
    const again = await newStore('race', syncer, 0);
    const reopened = (await again.open({ format: STATE_FORMAT, id: state.id, spec })).retain();
    await eventually('the settle syncing the image', () => seen.some((p) => p.endsWith('.mem')));
    const { dir } = await again.newPausedDir();
    await writeFile(join(dir, 'memory.delta'), randomBytes(100));
    const paused = again.persistPaused(
      [join(dir, 'memory.delta')],
      [again.pausedDir],
      reopened,
      null,
    );
    await eventually('the pause syncing the delta', () => seen.some((p) => p.endsWith('.delta')));
    releaseImage();
    await eventually('the delta removed by the settle', () => !existsSync(deltaPath));
    releaseDelta();
    await paused;
    assert.equal(reopened.delta, null);
    reopened.release();
  });
});
