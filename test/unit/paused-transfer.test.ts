/**
 * A paused machine exported by one node's state store and imported by another's, with real
 * files on disk (no QEMU: the files are stand-ins of the right names and sizes). What a
 * hand-over between nodes relies on: the target fetches only the parts it lacks, reuses by id
 * what it has, checks every file's sha256 before it is put in place, resumes a broken fetch;
 * and restores onto the template build the state was made on, fetched from the source into its
 * image cache when its own differs, kept while a state uses it and collected after.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { ExportedFile, FileFetcher, PausedManifest } from '../../src/vm/machine.js';
import { VmError } from '../../src/vm/machine.js';
import type { MachineSpec } from '../../src/vm/qemu/qemu-args.js';
import type { QemuPaused } from '../../src/vm/qemu/qemu-paused.js';
import type { QemuState } from '../../src/vm/qemu/qemu-state.js';
import { StateStore } from '../../src/vm/qemu/state-store.js';
import { STATE_FORMAT } from '../../src/vm/storage/state-format.js';
import type { Syncer } from '../../src/vm/storage/durable.js';
import { eventually } from '../../testkit/eventually.js';
import { templateBuild } from '../helpers/template-build.js';

/** The frozen template's key (in the data directory). */
const KEY = 'abcdef0123456789abcdef01';
/** The template build's key (in the image cache) the source's states run on. */
const BUILD = '0123456789abcdef';

let root: string;
let spec: MachineSpec;

/** A node's state store: its data directory `name`, its image cache (one shared by default). */
async function newStore(
  name: string,
  cache = join(root, 'cache'),
  syncer?: Syncer,
): Promise<StateStore> {
  const store = new StateStore(join(root, name), undefined, cache, syncer);
  await store.init();
  return store;
}

/** A template frozen in `store` (memory, device state, its disk layer). */
async function freezeTemplate(store: StateStore): Promise<void> {
  const dir = join(store.templatesDir, KEY);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'memory.img'), randomBytes(300_000));
  await writeFile(join(dir, 'device.state'), randomBytes(2000));
  await writeFile(join(dir, 'disk.qcow2'), randomBytes(5000));
  await writeFile(join(dir, 'complete'), '1\n');
}

/** A machine paused in `store` over a layer of its own on the template's layer. */
async function pauseOne(store: StateStore, on: MachineSpec = spec): Promise<QemuPaused> {
  const origin = await store.cachedTemplate(KEY, on);
  assert.ok(origin);
  const layerId = `layer-${randomBytes(8).toString('hex')}`;
  await writeFile(join(store.disks.dir, `${layerId}.qcow2`), randomBytes(9000));
  await writeFile(
    join(store.disks.dir, `${layerId}.json`),
    JSON.stringify({ backing: `template-${KEY}` }),
  );
  const { id, dir } = await store.newPausedDir();
  const delta = randomBytes(200_000);
  const device = randomBytes(3000);
  await writeFile(join(dir, 'memory.delta'), delta);
  await writeFile(join(dir, 'device.state'), device);
  await writeFile(join(dir, 'disk.qcow2'), randomBytes(7000));
  await writeFile(join(dir, 'disk.json'), JSON.stringify({ backing: layerId }));
  const disk = await store.disks.openPaused(dir);
  return store.addPaused(id, dir, origin.retain(), device, delta.length, disk);
}

/**
 * A frozen state of `store` as a snapshot is: a fork point over a disk layer of its own on the
 * template's layer (the template frozen first).
 */
async function freezeFork(store: StateStore, on: MachineSpec = spec): Promise<QemuState> {
  const hex = randomBytes(8).toString('hex');
  const layerId = `layer-${hex}`;
  await writeFile(join(store.disks.dir, `${layerId}.qcow2`), randomBytes(6000));
  await writeFile(
    join(store.disks.dir, `${layerId}.json`),
    JSON.stringify({ backing: `template-${KEY}` }),
  );
  const id = `fork-${hex}`;
  await writeFile(join(store.imagesDir, `${id}.mem`), randomBytes(250_000));
  await writeFile(join(store.imagesDir, `${id}.state`), randomBytes(2500));
  await writeFile(join(store.imagesDir, `${id}.json`), JSON.stringify({ disk: layerId }));
  return (await store.open({ format: STATE_FORMAT, id, spec: on })).retain();
}

/** Fetches from `source`'s exported files, counting what was asked. */
function fetcherOf(
  source: StateStore,
  asked: string[],
  tamper?: (file: ExportedFile, chunk: Buffer) => Buffer,
): FileFetcher {
  return async (file, offset) => {
    asked.push(`${file.path}@${offset}`);
    const { stream } = await source.transfer.read(file.path, offset);
    if (!tamper) return stream as AsyncIterable<Uint8Array>;
    return (async function* () {
      for await (const c of stream as AsyncIterable<Buffer>) yield tamper(file, c);
    })();
  };
}

async function sameFile(a: string, b: string): Promise<void> {
  assert.deepEqual(await readFile(a), await readFile(b));
}

describe('export and import of a paused machine between data directories', () => {
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'hostd-transfer-'));
    spec = await templateBuild(join(root, 'cache'), BUILD);
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('lists every file a paused machine needs, with sizes and sha256, in the order of use', async () => {
    const source = await newStore('list');
    await freezeTemplate(source);
    const paused = await pauseOne(source);
    const manifest = await source.transfer.export(paused);
    assert.deepEqual(
      manifest.parts.map((p) => p.kind),
      ['state', 'layer', 'paused'],
    );
    assert.equal(manifest.parts[0]!.id, `template-${KEY}`);
    assert.equal(manifest.paused.id, paused.id);
    for (const part of manifest.parts) {
      for (const f of part.files) {
        assert.match(f.sha256, /^[0-9a-f]{64}$/);
        assert.ok(f.size > 0, f.path);
      }
    }
    await paused.discard();
  });

  it('copies the origin too to a node with a fresh data directory, and opens it there', async () => {
    const source = await newStore('src-fresh');
    await freezeTemplate(source);
    const paused = await pauseOne(source);
    const manifest = await source.transfer.export(paused);
    const target = await newStore('dst-fresh');
    const asked: string[] = [];
    const imported = await target.transfer.import(manifest, fetcherOf(source, asked));
    assert.equal(imported.id, paused.id);
    assert.equal(imported.origin.id, `template-${KEY}`);
    const files = manifest.parts.flatMap((p) => p.files);
    assert.equal(asked.length, files.length);
    for (const f of files)
      await sameFile(join(source.dataDir, f.path), join(target.dataDir, f.path));
    // Nothing staged is left beside what was put in place.
    assert.deepEqual((await readdir(target.pausedDir)).sort(), [paused.id]);
    assert.ok(!(await readdir(target.disks.dir)).some((n) => n.endsWith('.part')));
    await imported.discard();
    await paused.discard();
  });

  it('reuses by id what the target has: only the paused machine and its own layer travel', async () => {
    const source = await newStore('src-seeded');
    await freezeTemplate(source);
    const paused = await pauseOne(source);
    const manifest = await source.transfer.export(paused);
    const target = await newStore('dst-seeded');
    await cp(join(source.templatesDir, KEY), join(target.templatesDir, KEY), { recursive: true });
    const asked: string[] = [];
    const imported = await target.transfer.import(manifest, fetcherOf(source, asked));
    assert.ok(
      asked.every((a) => !a.startsWith('templates/')),
      asked.join(' '),
    );
    assert.equal(asked.length, 6);
    await imported.discard();
    // A second import of another machine over the same layer fetches only its own folder.
    const again = await newStore('dst-seeded');
    const asked2: string[] = [];
    const other = await pauseOne(source);
    const m2 = await source.transfer.export(other);
    const i2 = await again.transfer.import(m2, fetcherOf(source, asked2));
    assert.ok(asked2.every((a) => !a.startsWith('templates/')));
    await i2.discard();
    await other.discard();
    await paused.discard();
  });

  it('takes the source’s template as a state of its own where the target froze another boot of it', async () => {
    const source = await newStore('src-other');
    await freezeTemplate(source);
    const paused = await pauseOne(source);
    const manifest = await source.transfer.export(paused);
    const target = await newStore('dst-other');
    await freezeTemplate(target); // same key, another boot: other bytes
    const own = await readFile(join(target.templatesDir, KEY, 'memory.img'));
    const asked: string[] = [];
    const imported = await target.transfer.import(manifest, fetcherOf(source, asked));
    assert.match(imported.origin.id, /^fork-[0-9a-f]{16}$/);
    await sameFile(
      join(source.templatesDir, KEY, 'memory.img'),
      join(target.imagesDir, `${imported.origin.id}.mem`),
    );
    assert.deepEqual(await readFile(join(target.templatesDir, KEY, 'memory.img')), own);
    // The chain under the paused disk now ends on the source's template disk, as a layer.
    const chain = imported.disk?.layer?.chain().map((l) => l.id) ?? [];
    assert.equal(chain.length, 2);
    assert.match(chain[0]!, /^layer-[0-9a-f]{16}$/);
    assert.equal(chain[0]!.slice('layer-'.length), imported.origin.id.slice('fork-'.length));
    await sameFile(
      join(source.templatesDir, KEY, 'disk.qcow2'),
      join(target.disks.dir, `${chain[0]}.qcow2`),
    );
    // A second machine of that source reuses the renamed template: its own files only travel.
    const other = await pauseOne(source);
    const asked2: string[] = [];
    const i2 = await target.transfer.import(
      await source.transfer.export(other),
      fetcherOf(source, asked2),
    );
    assert.equal(i2.origin.id, imported.origin.id);
    assert.ok(
      asked2.every((a) => !a.startsWith('templates/')),
      asked2.join(' '),
    );
    await i2.discard();
    await other.discard();
    await imported.discard();
    await paused.discard();
  });

  it('carries a frozen state alone (a snapshot’s), and fetches none of it where a paused machine over it brought it', async () => {
    const source = await newStore('src-state');
    await freezeTemplate(source);
    const state = await freezeFork(source);
    const manifest = await source.transfer.exportState(state);
    assert.deepEqual(
      manifest.parts.map((p) => p.kind),
      ['state', 'layer', 'state'],
    );
    assert.equal(manifest.state.id, state.id);
    const target = await newStore('dst-state');
    const asked: string[] = [];
    const imported = await target.transfer.importState(manifest, fetcherOf(source, asked));
    assert.equal(imported.id, state.id);
    const files = manifest.parts.flatMap((p) => p.files);
    assert.equal(asked.length, files.length);
    for (const f of files)
      await sameFile(join(source.dataDir, f.path), join(target.dataDir, f.path));
    // A node that took a paused machine restored from that state has it whole: nothing travels.
    const { id, dir } = await source.newPausedDir();
    const device = randomBytes(1000);
    await writeFile(join(dir, 'memory.delta'), randomBytes(5000));
    await writeFile(join(dir, 'device.state'), device);
    const paused = source.addPaused(id, dir, state.retain(), device, 5000, null);
    const seeded = await newStore('dst-state-seeded');
    const moved = await seeded.transfer.import(
      await source.transfer.export(paused),
      fetcherOf(source, []),
    );
    const asked2: string[] = [];
    const again = await seeded.transfer.importState(manifest, fetcherOf(source, asked2));
    assert.equal(again.id, state.id);
    assert.deepEqual(asked2, []);
    await moved.discard();
    await paused.discard();
    state.release();
  });

  it('refuses a file whose bytes differ from the export, and leaves nothing of it', async () => {
    const source = await newStore('src-bad');
    await freezeTemplate(source);
    const paused = await pauseOne(source);
    const manifest = await source.transfer.export(paused);
    const target = await newStore('dst-bad');
    const flip = (file: ExportedFile, c: Buffer): Buffer => {
      if (!file.path.endsWith('memory.delta')) return c;
      const copy = Buffer.from(c);
      copy[0] = copy[0]! ^ 0xff;
      return copy;
    };
    await assert.rejects(
      target.transfer.import(manifest, fetcherOf(source, [], flip)),
      (err: unknown) => err instanceof VmError && err.kind === 'state_corrupt',
    );
    assert.ok(!(await readdir(target.pausedDir)).includes(paused.id));
    await paused.discard();
  });

  it('resumes a fetch that broke off from the bytes it has', async () => {
    const source = await newStore('src-resume');
    await freezeTemplate(source);
    const paused = await pauseOne(source);
    const manifest = await source.transfer.export(paused);
    const target = await newStore('dst-resume');
    const asked: string[] = [];
    let broke = false;
    const inner = fetcherOf(source, asked);
    const fetch: FileFetcher = async (file, offset) => {
      const body = await inner(file, offset);
      if (broke || !file.path.endsWith('memory.img')) return body;
      broke = true;
      return (async function* () {
        let n = 0;
        for await (const c of body) {
          yield c;
          n += c.length;
          if (n >= 65536) throw new Error('connection reset');
        }
      })();
    };
    const imported = await target.transfer.import(manifest, fetch);
    const resumed = asked.filter((a) => a.startsWith(`templates/${KEY}/memory.img@`));
    assert.equal(resumed.length, 2);
    assert.ok(Number(resumed[1]!.split('@')[1]) >= 65536, resumed.join(' '));
    await sameFile(
      join(source.templatesDir, KEY, 'memory.img'),
      join(target.templatesDir, KEY, 'memory.img'),
    );
    await imported.discard();
    await paused.discard();
  });

  it('serves only files of the exported kinds', async () => {
    const source = await newStore('src-serve');
    for (const path of ['../etc/passwd', 'sandboxes/x.json', 'paused/pause-0/../../node-id']) {
      await assert.rejects(
        source.transfer.read(path, 0),
        (err: unknown) => err instanceof VmError && err.kind === 'unsupported',
      );
    }
  });
});

describe('a state whose template build the target lacks', () => {
  let cacheA: string;
  /** The target's image cache, one per test. */
  let cacheB: string;
  /** The source's build (`BUILD`, in cache A): the one its states run on. */
  let specA: MachineSpec;

  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'hostd-build-copy-'));
    cacheA = join(root, 'cache-a');
    specA = await templateBuild(cacheA, BUILD);
    spec = specA;
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  /** A source on cache A with the template frozen, and a target on a cache of its own. */
  async function nodes(name: string): Promise<{ source: StateStore; target: StateStore }> {
    cacheB = join(root, `cache-${name}`);
    const source = await newStore(`src-${name}`, cacheA);
    await freezeTemplate(source);
    const target = await newStore(`dst-${name}`, cacheB);
    return { source, target };
  }

  const buildFiles = (asked: string[]): string[] => asked.filter((a) => a.startsWith('cache/'));
  const copiesOf = async (store: StateStore): Promise<string[]> =>
    readdir(join(store.builds!.area, 'python')).catch(() => []);

  it('fetches the source’s build where the target’s own build differs, restores onto it, and never fetches it again', async () => {
    const { source, target } = await nodes('other-key');
    const own = await templateBuild(cacheB, 'fedcba9876543210'); // the target's own build
    const paused = await pauseOne(source, specA);
    const manifest = await source.transfer.export(paused);
    assert.equal(manifest.build?.key, BUILD);
    assert.equal(manifest.build?.template, 'python');
    const asked: string[] = [];
    const imported = await target.transfer.import(manifest, fetcherOf(source, asked));
    // The build came first, whole: its four files and its manifest, each once from byte 0.
    assert.deepEqual(
      buildFiles(asked).map((a) => a.replace(/^.*\//, '')),
      ['vmlinux@0', 'initrd.cpio@0', 'rootfs.erofs@0', 'disk.qcow2@0', 'manifest.json@0'],
    );
    assert.ok(asked[0]!.startsWith('cache/'), asked.join(' '));
    // The machine runs on the copy, in the target's image cache under the build's key.
    const dir = dirname(imported.origin.spec.image.rootfs);
    assert.ok(dir.startsWith(`${join(cacheB, 'copies')}/`), dir);
    assert.match(dir, new RegExp(`/python/${BUILD}-[0-9a-f]{16}$`));
    assert.equal(imported.origin.spec.image.key, BUILD);
    for (const name of ['vmlinux', 'initrd.cpio', 'rootfs.erofs', 'disk.qcow2', 'manifest.json'])
      await sameFile(join(dirname(specA.image.rootfs), name), join(dir, name));
    assert.equal(imported.origin.spec.image.disk, join(dir, 'disk.qcow2'));
    // Its record reopens it there (after a restart too), and the target's own build is untouched.
    assert.deepEqual(imported.describe().origin.spec, imported.origin.spec);
    const ownManifest = await readFile(join(dirname(own.image.rootfs), 'manifest.json'), 'utf8');
    assert.equal((JSON.parse(ownManifest) as { key: string }).key, 'fedcba9876543210');
    // A second machine of that build: found by key and content, not fetched again.
    const other = await pauseOne(source, specA);
    const asked2: string[] = [];
    const i2 = await target.transfer.import(
      await source.transfer.export(other),
      fetcherOf(source, asked2),
    );
    assert.deepEqual(buildFiles(asked2), []);
    assert.equal(dirname(i2.origin.spec.image.rootfs), dir);
    await i2.discard();
    await other.discard();
    await imported.discard();
    await paused.discard();
  });

  it('copies a build of the same key whose files differ (built elsewhere at another time), apart from its own', async () => {
    const { source, target } = await nodes('same-key');
    const own = await templateBuild(cacheB, BUILD, { seed: 'b' }); // same key, other bytes
    const paused = await pauseOne(source, specA);
    const asked: string[] = [];
    const imported = await target.transfer.import(
      await source.transfer.export(paused),
      fetcherOf(source, asked),
    );
    assert.equal(buildFiles(asked).length, 5);
    const dir = dirname(imported.origin.spec.image.rootfs);
    assert.notEqual(dir, dirname(own.image.rootfs));
    await sameFile(specA.image.rootfs, join(dir, 'rootfs.erofs'));
    assert.deepEqual(
      await readFile(own.image.rootfs),
      Buffer.alloc(300_000, `brootfs.erofs${BUILD}`),
    );
    await imported.discard();
    await paused.discard();
  });

  it('links the files its own build of another key shares with the source’s instead of fetching them', async () => {
    const { source, target } = await nodes('shared-files');
    // The target's own build: the source's files under another key (other resources, say).
    const own = await templateBuild(cacheB, 'fedcba9876543210');
    for (const name of ['vmlinux', 'initrd.cpio', 'rootfs.erofs', 'disk.qcow2'])
      await cp(join(dirname(specA.image.rootfs), name), join(dirname(own.image.rootfs), name));
    const manifestA = JSON.parse(
      await readFile(join(dirname(specA.image.rootfs), 'manifest.json'), 'utf8'),
    ) as Record<string, unknown>;
    await writeFile(
      join(dirname(own.image.rootfs), 'manifest.json'),
      JSON.stringify({ ...manifestA, key: 'fedcba9876543210' }),
    );
    const paused = await pauseOne(source, specA);
    const asked: string[] = [];
    const imported = await target.transfer.import(
      await source.transfer.export(paused),
      fetcherOf(source, asked),
    );
    assert.deepEqual(
      buildFiles(asked).map((a) => a.replace(/^.*\//, '')),
      ['manifest.json@0'],
    );
    const dir = dirname(imported.origin.spec.image.rootfs);
    assert.ok(dir.startsWith(join(cacheB, 'copies')), dir);
    await sameFile(specA.image.rootfs, join(dir, 'rootfs.erofs'));
    await imported.discard();
    await paused.discard();
  });

  it('uses its own build when its files are the source’s, wherever its image cache is', async () => {
    const { source, target } = await nodes('same-build');
    const own = await templateBuild(cacheB, BUILD); // the same bytes, in another cache folder
    const paused = await pauseOne(source, specA);
    const asked: string[] = [];
    const imported = await target.transfer.import(
      await source.transfer.export(paused),
      fetcherOf(source, asked),
    );
    assert.deepEqual(buildFiles(asked), []);
    assert.equal(imported.origin.spec.image.rootfs, own.image.rootfs);
    assert.deepEqual(await copiesOf(target), []);
    await imported.discard();
    await paused.discard();
  });

  it('carries a snapshot’s state onto the source’s build too', async () => {
    const { source, target } = await nodes('state');
    await templateBuild(cacheB, 'fedcba9876543210');
    const state = await freezeFork(source, specA);
    const asked: string[] = [];
    const imported = await target.transfer.importState(
      await source.transfer.exportState(state),
      fetcherOf(source, asked),
    );
    assert.equal(buildFiles(asked).length, 5);
    assert.ok(imported.spec.image.rootfs.startsWith(join(cacheB, 'copies')));
    assert.deepEqual(target.describe(imported).spec, imported.spec);
    imported.release();
    state.release();
  });

  it('refuses a build file whose bytes differ from the export, and keeps no copy of it', async () => {
    const { source, target } = await nodes('tampered');
    const paused = await pauseOne(source, specA);
    const manifest = await source.transfer.export(paused);
    const flip = (file: ExportedFile, c: Buffer): Buffer => {
      if (!file.path.endsWith('rootfs.erofs')) return c;
      const copy = Buffer.from(c);
      copy[10] = copy[10]! ^ 0xff;
      return copy;
    };
    const asked: string[] = [];
    await assert.rejects(
      target.transfer.import(manifest, fetcherOf(source, asked, flip)),
      (err: unknown) => err instanceof VmError && err.kind === 'state_corrupt',
    );
    // Nothing but the build was fetched, and nothing of it is usable.
    assert.ok(
      asked.every((a) => a.startsWith('cache/')),
      asked.join(' '),
    );
    assert.deepEqual(
      (await copiesOf(target)).filter((n) => !n.startsWith('.in-')),
      [],
    );
    for (const n of await copiesOf(target)) {
      const left = await readdir(join(target.builds!.area, 'python', n));
      assert.ok(!left.includes('rootfs.erofs'), left.join(' '));
    }
    assert.ok(!(await readdir(target.pausedDir)).includes(paused.id));
    await paused.discard();
  });

  it('refuses an export whose build is not the one its state names, before fetching anything', async () => {
    const { source, target } = await nodes('forged');
    const paused = await pauseOne(source, specA);
    const manifest = await source.transfer.export(paused);
    const forged: PausedManifest = {
      ...manifest,
      build: { ...manifest.build!, key: 'ffffffffffffffff' },
    };
    const asked: string[] = [];
    await assert.rejects(
      target.transfer.import(forged, fetcherOf(source, asked)),
      (err: unknown) => err instanceof VmError && err.kind === 'state_corrupt',
    );
    // An older node's export carries no build: the target must have it where the state says
    // (the source's image cache, on another host: not here).
    const bare: PausedManifest = { ...manifest };
    delete (bare as { build?: unknown }).build;
    const elsewhere = { ...specA.image, rootfs: join(root, 'host-a', 'rootfs.erofs') };
    const old: PausedManifest = {
      ...bare,
      paused: {
        ...bare.paused,
        origin: { ...bare.paused.origin, spec: { ...specA, image: elsewhere } },
      },
    };
    await assert.rejects(
      target.transfer.import(old, fetcherOf(source, asked)),
      (err: unknown) => err instanceof VmError && err.kind === 'state_corrupt',
    );
    assert.deepEqual(asked, []);
    await paused.discard();
  });

  it('resumes a build file whose fetch broke off, within an import and in the next one', async () => {
    const { source, target } = await nodes('resume');
    const paused = await pauseOne(source, specA);
    const manifest = await source.transfer.export(paused);
    const asked: string[] = [];
    const inner = fetcherOf(source, asked);
    let breaks = 0;
    // The root filesystem breaks off after 64 KiB three times (an import's every try), then
    // once more: the next import resumes from what the first left.
    const fetch: FileFetcher = async (file, offset) => {
      const body = await inner(file, offset);
      if (breaks >= 4 || !file.path.endsWith('rootfs.erofs')) return body;
      breaks++;
      return (async function* () {
        let n = 0;
        for await (const c of body) {
          yield c;
          n += c.length;
          if (n >= 65536) throw new Error('connection reset');
        }
      })();
    };
    await assert.rejects(target.transfer.import(manifest, fetch), /connection reset/);
    const imported = await target.transfer.import(manifest, fetch);
    const tries = asked.filter((a) => a.includes('/rootfs.erofs@'));
    assert.equal(tries.length, 5, tries.join(' '));
    const offsets = tries.map((a) => Number(a.split('@')[1]));
    assert.equal(offsets[0], 0);
    for (let i = 1; i < offsets.length; i++)
      assert.ok(offsets[i]! > offsets[i - 1]!, tries.join(' '));
    await sameFile(specA.image.rootfs, imported.origin.spec.image.rootfs);
    await imported.discard();
    await paused.discard();
  });

  it('keeps a copied build while a state uses it and collects it after, never the node’s own', async () => {
    const { source, target } = await nodes('collect');
    const own = await templateBuild(cacheB, 'fedcba9876543210');
    const paused = await pauseOne(source, specA);
    const manifest = await source.transfer.export(paused);
    const imported = await target.transfer.import(manifest, fetcherOf(source, []));
    const dir = dirname(imported.origin.spec.image.rootfs);
    const desc = imported.describe();
    // A restart: a new process reopens the paused machine from its record, then collects.
    const restarted = await newStore('dst-collect', cacheB);
    const reopened = await restarted.openPaused(desc);
    await restarted.collectGarbage();
    assert.ok(existsSync(join(dir, 'manifest.json')));
    // A half-fetched build another import left is collected with what nothing uses.
    await mkdir(join(dirname(dir), '.in-1111111111111111-2222222222222222'), { recursive: true });
    // The machine resumed elsewhere or deleted: its build goes once no state uses it.
    await reopened.discard();
    await eventually('the copied build collected', () => !existsSync(dir));
    assert.ok(existsSync(own.image.rootfs));
    await restarted.collectGarbage();
    assert.deepEqual(await copiesOf(restarted), []);
    // And at a start that reopens nothing, the copy the first process made goes too.
    const again = await newStore('dst-collect-2', cacheB);
    const m2 = await source.transfer.export(paused);
    const i2 = await again.transfer.import(m2, fetcherOf(source, []));
    const dir2 = dirname(i2.origin.spec.image.rootfs);
    const fresh = await newStore('dst-collect-2', cacheB);
    assert.equal(await fresh.builds!.collect(() => false), 1);
    assert.ok(!existsSync(dir2));
    assert.ok(existsSync(own.image.rootfs));
    // The copies of a data directory that is gone go at any node's start; a live one's stay.
    const area = async (hex: string, dataDir: string): Promise<string> => {
      const a = join(cacheB, 'copies', hex);
      await mkdir(join(a, 'python', `${BUILD}-${hex}`), { recursive: true });
      await writeFile(join(a, 'data-dir'), `${dataDir}\n`);
      return a;
    };
    const gone = await area('eeeeeeeeeeeeeeee', join(root, 'no-such-data-dir'));
    const alive = await area('dddddddddddddddd', source.dataDir);
    await fresh.collectGarbage();
    assert.ok(!existsSync(gone));
    assert.ok(existsSync(join(alive, 'python', `${BUILD}-dddddddddddddddd`)));
    await paused.discard();
  });

  it('serves a build’s files from the image cache, and nothing else of it', async () => {
    const source = await newStore('src-serve-build', cacheA);
    const path = `cache/templates/python/${BUILD}/rootfs.erofs`;
    const { size, stream } = await source.transfer.read(path, 0);
    stream.destroy();
    assert.equal(size, 300_000);
    for (const bad of [
      `cache/templates/python/${BUILD}/../../../etc/passwd`,
      `cache/templates/python/${BUILD}`,
      'cache/templates/python/build.log',
      'cache/debian/0123456789abcdef/rootfs.tar',
      `cache/templates/python/${BUILD}/rootfs.json`,
    ]) {
      await assert.rejects(
        source.transfer.read(bad, 0),
        (err: unknown) => err instanceof VmError && err.kind === 'unsupported',
        bad,
      );
    }
  });
});

describe('a fork point reopened by two at once', () => {
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'hostd-reopen-'));
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('is one state, whose files stay until the last of them lets it go', async () => {
    const cache = join(root, 'cache-reopen');
    const on = await templateBuild(cache, BUILD);
    const first = await newStore('reopen-twice', cache);
    await freezeTemplate(first);
    const made = await freezeFork(first, on);
    // Another run of hostd on the same data directory: two sandboxes on the fork point handed
    // over together (or reopened at a start) open it at the same moment.
    const second = await newStore('reopen-twice', cache);
    const desc = { format: STATE_FORMAT, id: made.id, spec: on };
    const [a, b] = await Promise.all([second.open(desc), second.open(desc)]);
    assert.equal(a, b, 'one state, not two registrations of one id');
    a.retain();
    b.retain();
    a.release();
    assert.ok(existsSync(join(second.imagesDir, `${made.id}.mem`)), 'the other still runs on it');
    assert.equal(await second.open(desc), b);
    b.release();
    await eventually(
      'the fork point deleted with its last reference',
      async () => !existsSync(join(second.imagesDir, `${made.id}.mem`)),
    );
  });
});

/** A syncer that records each fsync (relative to `root`) and does it at once. */
function recordingSyncer(): Syncer & { synced: string[] } {
  const synced: string[] = [];
  const note = (p: string): Promise<void> => {
    synced.push(p.slice(root.length + 1) || '.');
    return Promise.resolve();
  };
  return { synced, file: note, dir: note };
}

describe('what a snapshot or a pause names is durable before it is recorded', () => {
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'hostd-durable-'));
    spec = await templateBuild(join(root, 'cache'), BUILD);
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('syncs a fork point, its disk layers and the folders naming them, each once', async () => {
    const syncer = recordingSyncer();
    const store = await newStore('persist-fork', join(root, 'cache'), syncer);
    await freezeTemplate(store);
    const state = await freezeFork(store);
    const layer = state.layer!.id;
    await store.persistState(state);
    assert.deepEqual(syncer.synced.sort(), [
      'persist-fork/disks',
      `persist-fork/disks/${layer}.json`,
      `persist-fork/disks/${layer}.qcow2`,
      'persist-fork/images',
      `persist-fork/images/${state.id}.json`,
      `persist-fork/images/${state.id}.mem`,
      `persist-fork/images/${state.id}.state`,
      'persist-fork/templates',
      `persist-fork/templates/${KEY}`,
      `persist-fork/templates/${KEY}/disk.qcow2`,
    ]);
    syncer.synced.length = 0;
    await store.persistState(state);
    assert.deepEqual(syncer.synced, [], 'files that never change are synced once');
    state.release();
  });

  it('syncs a paused machine with its origin and layers, and its folder again every time', async () => {
    const syncer = recordingSyncer();
    const store = await newStore('persist-paused', join(root, 'cache'), syncer);
    await freezeTemplate(store);
    const paused = await pauseOne(store);
    const own = ['memory.delta', 'device.state', 'disk.json'].map((n) => join(paused.dir, n));
    await store.persistPaused(own, [store.pausedDir], paused.origin, paused.disk!.layer);
    const layer = paused.disk!.layer!.id;
    const p = `persist-paused/paused/${paused.id}`;
    assert.deepEqual(syncer.synced.sort(), [
      'persist-paused/disks',
      `persist-paused/disks/${layer}.json`,
      `persist-paused/disks/${layer}.qcow2`,
      'persist-paused/paused',
      p,
      `${p}/device.state`,
      `${p}/disk.json`,
      `${p}/memory.delta`,
      'persist-paused/templates',
      `persist-paused/templates/${KEY}`,
      `persist-paused/templates/${KEY}/complete`,
      `persist-paused/templates/${KEY}/device.state`,
      `persist-paused/templates/${KEY}/disk.qcow2`,
      `persist-paused/templates/${KEY}/memory.img`,
    ]);
    syncer.synced.length = 0;
    await store.persistPaused(own, [], paused.origin, paused.disk!.layer);
    assert.deepEqual(syncer.synced.sort(), [
      p,
      `${p}/device.state`,
      `${p}/disk.json`,
      `${p}/memory.delta`,
    ]);
    await paused.discard();
  });

  it('an imported snapshot state is durable when the import resolves, records rewritten included', async () => {
    const source = await newStore('persist-src');
    await freezeTemplate(source);
    const state = await freezeFork(source);
    const manifest = await source.transfer.exportState(state);
    const syncer = recordingSyncer();
    const target = await newStore('persist-dst', join(root, 'cache'), syncer);
    const imported = await target.transfer.importState(manifest, fetcherOf(source, []));
    const synced = new Set(syncer.synced);
    // Of the template, the fork point needs only its disk layer: its own image is whole.
    const needed = manifest.parts
      .flatMap((part) => part.files)
      .filter((f) => !/^templates\/.*\/(memory\.img|device\.state|complete)$/.test(f.path));
    assert.equal(needed.length, 6);
    for (const f of needed) {
      assert.ok(synced.has(`persist-dst/${f.path}`), f.path);
      assert.ok(synced.has(`persist-dst/${dirname(f.path)}`), dirname(f.path));
    }
    imported.retain().release();
    state.release();
  });
});

describe('an imported snapshot state whose sync fails', () => {
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'hostd-durable-fail-'));
    spec = await templateBuild(join(root, 'cache'), BUILD);
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('leaves none of its files: the next import fetches it again and keeps it', async () => {
    const source = await newStore('fail-src');
    await freezeTemplate(source);
    const state = await freezeFork(source);
    const manifest = await source.transfer.exportState(state);
    let failing = true;
    const once: Syncer = {
      file: () => (failing ? Promise.reject(new Error('EIO')) : Promise.resolve()),
      dir: () => Promise.resolve(),
    };
    const target = await newStore('fail-dst', join(root, 'cache'), once);
    await assert.rejects(target.transfer.importState(manifest, fetcherOf(source, [])));
    const left = async (): Promise<string[]> =>
      (await readdir(target.imagesDir)).filter((n) => n.startsWith(state.id));
    await eventually('its image and records to go', async () => (await left()).length === 0);
    failing = false;
    const imported = await target.transfer.importState(manifest, fetcherOf(source, []));
    assert.equal(imported.id, state.id);
    imported.retain().release();
    state.release();
  });
});
