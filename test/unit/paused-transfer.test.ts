/**
 * A paused machine exported by one node's state store and imported by another's, with real
 * files on disk (no QEMU: the files are stand-ins of the right names and sizes). What a
 * hand-over between nodes relies on: the target fetches only the parts it lacks, reuses by id
 * what it has, checks every file's sha256 before it is put in place, resumes a broken fetch,
 * and refuses a state made for another template build before fetching anything.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { cp, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { ExportedFile, FileFetcher, PausedManifest } from '../../src/vm/machine.js';
import { VmError } from '../../src/vm/machine.js';
import type { MachineSpec } from '../../src/vm/qemu/qemu-args.js';
import type { QemuPaused } from '../../src/vm/qemu/qemu-paused.js';
import type { QemuState } from '../../src/vm/qemu/qemu-state.js';
import { StateStore } from '../../src/vm/qemu/state-store.js';
import { STATE_FORMAT } from '../../src/vm/storage/state-format.js';

const KEY = 'abcdef0123456789abcdef01';

let root: string;
let spec: MachineSpec;

/** A template build on disk (its manifest names its key) and the spec of a machine of it. */
async function buildImage(key: string): Promise<MachineSpec> {
  const dir = join(root, 'cache', key);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'manifest.json'), JSON.stringify({ key }));
  await writeFile(join(dir, 'rootfs.erofs'), 'rootfs');
  return {
    image: {
      kernel: join(dir, 'vmlinux'),
      initrd: join(dir, 'initrd'),
      rootfs: join(dir, 'rootfs.erofs'),
      cmdline: '',
      key,
      disk: join(dir, 'disk.qcow2'),
    },
    memoryMib: 64,
    vcpus: 1,
    accel: 'tcg',
    tcgTbMib: 16,
  };
}

async function newStore(name: string): Promise<StateStore> {
  const store = new StateStore(join(root, name));
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
async function pauseOne(store: StateStore): Promise<QemuPaused> {
  const origin = await store.cachedTemplate(KEY, spec);
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
async function freezeFork(store: StateStore): Promise<QemuState> {
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
  return (await store.open({ format: STATE_FORMAT, id, spec })).retain();
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
    spec = await buildImage(KEY);
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

  it('refuses a state made for another template build before fetching anything', async () => {
    const source = await newStore('src-build');
    await freezeTemplate(source);
    const paused = await pauseOne(source);
    const manifest = await source.transfer.export(paused);
    const otherSpec = { ...spec, image: { ...spec.image, key: 'another-build' } };
    const forged: PausedManifest = {
      ...manifest,
      paused: { ...manifest.paused, origin: { ...manifest.paused.origin, spec: otherSpec } },
    };
    const target = await newStore('dst-build');
    const asked: string[] = [];
    await assert.rejects(
      target.transfer.import(forged, fetcherOf(source, asked)),
      (err: unknown) => err instanceof VmError && err.kind === 'state_corrupt',
    );
    assert.deepEqual(asked, []);
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
