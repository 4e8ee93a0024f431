/**
 * Frozen machine states on disk, under the data directory, so that they outlive hostd:
 *
 *   templates/<key>/memory.img, device.state,  a template's frozen boot, cached by the hash of
 *     disk.qcow2                                everything that shapes it (`templateKey`): a
 *                                               restart restores from it instead of booting
 *   images/<id>.mem, <id>.state, <id>.json      fork points: a fork's, a snapshot's (the JSON
 *     <id>.delta                                names its disk layer, and the template it was
 *                                               copied from); the delta, while the image is
 *                                               not durable yet (QemuState's StateDelta)
 *   paused/<id>/memory.delta, device.state,     paused machines (vm/qemu/qemu-paused.ts)
 *     disk.qcow2, disk.json
 *   disks/                                      writable disks (vm/storage/disk-store.ts)
 *
 * Template builds copied from other nodes for the states they took over live in the image
 * cache (vm/image/build-copies.ts) and go once no open state runs on them.
 *
 * A state is described to core by a `StateDescriptor` (plain JSON, stored in core's records) and
 * reopened from it after a restart. Every state open in this process is in `live`, once per id,
 * with a reference count; files of fork points nobody holds any more are deleted at once, and
 * `collectGarbage` removes what an earlier run left that no record reopened.
 */
import { createHash, randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, chown, mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import type { PausedDescriptor, StateDescriptor } from '../machine.js';
import { BuildCopies } from '../image/build-copies.js';
import { checkImageBuild } from '../image/image.js';
import { closeRamImages, MemImage, RAM_IMAGE_MODE } from '../storage/mem-image.js';
import { applyDeltaTo, writeDeltaFrom } from '../storage/page-delta.js';
import type { MachineSpec } from './qemu-args.js';
import { readBounded, syncFile, writeDurably } from '../storage/safe-files.js';
import { QemuPaused } from './qemu-paused.js';
import { PausedTransfer } from './paused-transfer.js';
import { QemuState, type StateDelta } from './qemu-state.js';
import { STATE_FORMAT } from '../storage/state-format.js';
import type { Vm } from './vm.js';
import type { DiskLayer } from '../storage/disk-layer.js';
import { DiskStore } from '../storage/disk-store.js';
import { DurableOnce, syncAll, type Syncer } from '../storage/durable.js';

const run = promisify(execFile);

const MAX_DEVICE_STATE = 64 * 1024 * 1024;

/**
 * How long a fork point made durable as a page delta waits before its image is synced and the
 * delta goes (`settleLater`): past the kernel's dirty expiry (30 s by default), by when the kernel's
 * own write-back has usually written the image, so that the fsync finds little left to do and
 * never runs beside the forks that follow a snapshot (docs/architecture.md, "Measured choices").
 */
export const SETTLE_DELAY_MS = 40_000;

/**
 * This boot of the host's kernel, or null if unknown. A fork point's record keeps it: reopened in
 * the same boot, its image is whole in the page cache whether or not it reached the disk. Read
 * once, then kept: it cannot change while hostd runs, and every fork point's record names it.
 */
let bootId: string | undefined;
function hostBootId(): string | null {
  if (bootId !== undefined) return bootId;
  try {
    bootId = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return null;
  }
  return bootId;
}

/** The key of a template's frozen boot: everything that must match for a restore to work. */
export function templateKey(spec: MachineSpec, qemuVersion: string): string {
  const h = createHash('sha256');
  h.update(JSON.stringify({ format: STATE_FORMAT, qemuVersion, spec }));
  return h.digest('hex').slice(0, 24);
}

export class StateStore {
  readonly templatesDir: string;
  readonly imagesDir: string;
  readonly pausedDir: string;
  readonly disks: DiskStore;
  readonly transfer: PausedTransfer;
  /** Builds copied from other nodes (none without an image cache: nothing is copied then). */
  readonly builds: BuildCopies | null;
  private readonly live = new Map<string, QemuState>();
  private readonly livePaused = new Set<string>();
  /**
   * States being reopened now, by id, joined by further opens of the same: two reopenings of one
   * fork point (two sandboxes on it handed over together) would each register it, and the
   * first one freed would delete the files the other still runs on.
   */
  private readonly opening = new Map<string, Promise<QemuState | null>>();
  /** States and disk layers made durable in this process (`persistState`). */
  private readonly durable: DurableOnce;
  /** Fork points whose page delta is written (or being written), `writeDelta`. */
  private readonly deltasWritten = new WeakMap<QemuState, Promise<void>>();
  /** Fork points whose image is to be synced, and their delta removed (`settleLater`). */
  private readonly settling = new WeakSet<QemuState>();

  constructor(
    readonly dataDir: string,
    /** The jailed QEMUs' group, when they run jailed: it must read (and map) images. */
    private readonly group?: number,
    /** The template image cache (SERVICE_CACHE_DIR), where builds copied from peers go. */
    cacheDir?: string,
    /** The fsyncs; tests record them. */
    private readonly syncer?: Syncer,
    /** How long a state durable as a delta waits before its image is synced (`settleLater`). */
    private readonly settleDelayMs = SETTLE_DELAY_MS,
  ) {
    this.durable = new DurableOnce(syncer);
    this.templatesDir = join(dataDir, 'templates');
    this.imagesDir = join(dataDir, 'images');
    this.pausedDir = join(dataDir, 'paused');
    this.disks = new DiskStore(dataDir, this.templatesDir, group);
    this.builds = cacheDir === undefined ? null : new BuildCopies(cacheDir, dataDir);
    this.transfer = new PausedTransfer(this, group, this.builds ?? undefined);
  }

  /** Whether an open state runs on the template build in folder `dir`. */
  buildInUse(dir: string): boolean {
    for (const state of this.live.values())
      if (dirname(state.spec.image.rootfs) === dir) return true;
    return false;
  }

  /** An import's state is open on build folder `dir` (or failed): its pin goes. */
  unpinBuild(dir: string): void {
    this.builds?.unpin(dir, (d) => this.buildInUse(d));
  }

  async init(): Promise<void> {
    for (const dir of [this.templatesDir, this.imagesDir, this.pausedDir]) {
      await mkdir(dir, { recursive: true, mode: 0o750 });
      // A jailed QEMU may open the images it is given by name, never list, create or rename
      // anything among them: names of other sandboxes' images are not its to learn.
      if (this.group !== undefined) {
        await chown(dir, 0, this.group);
        await chmod(dir, 0o710);
      }
    }
    await this.disks.init();
    if (this.group !== undefined) await closeRamImages(this.templatesDir, this.imagesDir);
  }

  /** A frozen template for `key` cached by an earlier run, or null. */
  async cachedTemplate(key: string, spec: MachineSpec): Promise<QemuState | null> {
    const id = `template-${key}`;
    return this.live.get(id) ?? this.reopenOnce(id, () => this.reopenTemplate(key, id, spec));
  }

  private async reopenTemplate(
    key: string,
    id: string,
    spec: MachineSpec,
  ): Promise<QemuState | null> {
    const dir = join(this.templatesDir, key);
    if (!existsSync(join(dir, 'complete'))) return null;
    if (spec.image.disk && !existsSync(join(dir, 'disk.qcow2'))) return null;
    const deviceState = await readBounded(join(dir, 'device.state'), MAX_DEVICE_STATE);
    const layer = spec.image.disk ? this.disks.templateLayer(key) : null;
    return this.adopt(id, spec, join(dir, 'memory.img'), deviceState, true, layer);
  }

  /** A fresh directory to boot a template in; `publishTemplate` makes it the cache entry. */
  async templateWorkDir(key: string): Promise<string> {
    const dir = join(this.templatesDir, `.boot-${key}-${process.pid}`);
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { mode: 0o750 });
    if (this.group !== undefined) {
      await chown(dir, 0, this.group);
      await chmod(dir, 0o710);
    }
    return dir;
  }

  /**
   * Makes the booted and frozen template in `workDir` (its RAM in memory.img) the cache entry
   * of `key`, durably, and returns its state.
   */
  async publishTemplate(
    key: string,
    workDir: string,
    spec: MachineSpec,
    deviceState: Buffer,
  ): Promise<QemuState> {
    const image = join(workDir, 'memory.img');
    // The template VM is gone: its overlay is now a layer every VM of the template reads.
    if (spec.image.disk && this.group !== undefined) {
      await chown(join(workDir, 'disk.qcow2'), 0, this.group);
      await chmod(join(workDir, 'disk.qcow2'), 0o640);
    }
    // Zero pages become holes: that halves a fresh guest's image, and forks copy less.
    await run('fallocate', ['--dig-holes', image]);
    // Written by the template's boot, read by every VM restored from it from now on.
    if (this.group !== undefined) await chmod(image, RAM_IMAGE_MODE);
    await writeDurably(join(workDir, 'device.state'), deviceState);
    await syncFile(image);
    if (spec.image.disk) await syncFile(join(workDir, 'disk.qcow2'));
    // The folder's entries, then (after the rename) its own: snapshots and paused sandboxes
    // of this template name it, and must find it after a host crash.
    await syncAll([], [workDir], this.syncer);
    await writeDurably(join(workDir, 'complete'), Buffer.from(`${STATE_FORMAT}\n`));
    const dir = join(this.templatesDir, key);
    await rm(dir, { recursive: true, force: true });
    await rename(workDir, dir);
    await syncAll([], [dir, this.templatesDir], this.syncer);
    const layer = spec.image.disk ? this.disks.templateLayer(key) : null;
    return this.adopt(`template-${key}`, spec, join(dir, 'memory.img'), deviceState, true, layer);
  }

  /** A new image path for a fork point or a spare copy. */
  newImagePath(kind: 'fork' | 'spare'): string {
    return MemImage.freshName(this.imagesDir, kind);
  }

  /**
   * Registers the fork point whose RAM is the complete image at `imagePath` and whose disk is
   * `layer`, writing its device state and the layer's id next to it so that the state can be
   * reopened after a restart.
   */
  async addFork(
    imagePath: string,
    spec: MachineSpec,
    deviceState: Buffer,
    layer: DiskLayer | null,
    incoming: Vm[] = [],
    /** The state the image was copied from and the pages the capture wrote over it. */
    origin: StateDelta | null = null,
  ): Promise<QemuState> {
    const id = imagePath.slice(this.imagesDir.length + 1).replace(/\.mem$/, '');
    // Only a template's image is durable whenever a fork point is: over any other base, a
    // delta would need that base synced first, which is the image's cost again.
    const delta = origin?.base.id.startsWith('template-') ? origin : null;
    await writeFile(join(this.imagesDir, `${id}.state`), deviceState, { mode: 0o640 });
    const meta = {
      disk: layer?.id ?? null,
      ...(delta ? { base: delta.base.id, boot: hostBootId() } : {}),
    };
    await writeFile(join(this.imagesDir, `${id}.json`), JSON.stringify(meta), { mode: 0o640 });
    const state = this.adopt(id, spec, imagePath, deviceState, false, layer, incoming);
    state.delta = delta;
    return state;
  }

  /**
   * Makes everything a record of `state` needs to reopen it after a host crash durable: its
   * image, device state and disk record (a fork point's; a template's folder), every disk layer
   * of its chain, and the directory entries naming them. A fork point is not synced when it is
   * made (a fork's children do not outlive the host): a snapshot syncs its own, and a pause its
   * origin's, before the record naming it is written. Each state and layer is synced once
   * (`DurableOnce`), all files at the same time, each directory once. A fork point copied from a
   * template's image is made durable as a page delta against it (QemuState's StateDelta), and
   * its image synced later (`settleLater`).
   */
  async persistState(state: QemuState): Promise<void> {
    await this.syncWith(state, this.layerFiles(state.layer));
    this.settleLater(state);
  }

  /**
   * Makes a paused machine durable (see `persistState`): `files` (its own: the page delta, the
   * device state, its disk's overlay and record) with the entries naming them, `dirs` (its
   * folder once complete, and the folder holding it), its `origin` state and the disk layers
   * under its overlay (`layer`). Its own files are synced whenever asked: each pause writes
   * new ones.
   */
  async persistPaused(
    files: readonly string[],
    dirs: readonly string[],
    origin: QemuState,
    layer: DiskLayer | null,
  ): Promise<void> {
    const own = { key: {}, files, dirs };
    await this.syncWith(origin, [own, ...this.layerFiles(layer)]);
    this.settleLater(origin);
  }

  /**
   * Syncs `state`'s files (`stateFiles`) with `others`, once each (`DurableOnce`). A state
   * durable as its delta may settle meanwhile (`settleLater`, due for a state reopened with its
   * delta): its image is then synced and its delta, named here, removed, maybe before its fsync
   * opened it. The state is then synced again as the fork point it has become, rather than
   * failing a pause (which would lose its sandbox) or a snapshot for a file no longer needed.
   */
  private async syncWith(
    state: QemuState,
    others: readonly { key: object; files: readonly string[]; dirs?: readonly string[] }[],
  ): Promise<void> {
    const asDelta = state.delta !== null;
    try {
      await this.durable.sync([...others, ...(await this.stateFiles(state))]);
    } catch (err) {
      if (!asDelta || state.delta !== null) throw err;
      await this.durable.sync([...others, ...(await this.stateFiles(state))]);
    }
  }

  /** The files a paused machine's folder `dir` holds (the layout above), for `persistPaused`. */
  pausedFiles(dir: string, withDisk: boolean): string[] {
    const names = [
      'memory.delta',
      'device.state',
      ...(withDisk ? ['disk.qcow2', 'disk.json'] : []),
    ];
    return names.map((n) => join(dir, n));
  }

  private async stateFiles(
    state: QemuState,
  ): Promise<{ key: object; files: string[]; dirs: string[] }[]> {
    const { delta } = state;
    if (delta) {
      await this.writeDelta(state, delta);
      const files = ['delta', 'state', 'json'].map((e) => join(this.imagesDir, `${state.id}.${e}`));
      return [{ key: state, files, dirs: [] }, ...(await this.stateFiles(delta.base))];
    }
    if (state.id.startsWith('template-')) {
      const dir = join(this.templatesDir, state.id.slice('template-'.length));
      const names = ['memory.img', 'device.state', 'complete'];
      if (state.spec.image.disk) names.push('disk.qcow2');
      return [{ key: state, files: names.map((n) => join(dir, n)), dirs: [this.templatesDir] }];
    }
    const files = ['mem', 'state', 'json'].map((ext) => join(this.imagesDir, `${state.id}.${ext}`));
    return [{ key: state, files, dirs: [] }];
  }

  /** Writes fork point `state`'s page delta (`<id>.delta`) once; a failed write is retried. */
  private writeDelta(state: QemuState, delta: StateDelta): Promise<void> {
    const known = this.deltasWritten.get(state);
    if (known) return known;
    const path = join(this.imagesDir, `${state.id}.delta`);
    // Renamed into place whole: a delta that is there is complete (`reopenFork` rebuilds from it).
    const work = (async () => {
      await rm(`${path}.part`, { force: true });
      await writeDeltaFrom(state.image.path, delta.runs, `${path}.part`);
      await rename(`${path}.part`, path);
    })();
    this.deltasWritten.set(state, work);
    work.catch(() => {
      if (this.deltasWritten.get(state) === work) this.deltasWritten.delete(state);
    });
    return work;
  }

  /**
   * Once `settleDelayMs` has passed, syncs the image of `state` (durable as a page delta) and
   * removes the delta: the state is then a fork point like any other. Its image is written back
   * by the kernel in that time anyway, as every file is (a snapshot's image stays on disk), so
   * the fsync costs little; a removed delta that a crash brings back only costs a rebuild.
   * Expected failures (the state freed meanwhile, a failing disk) keep the delta, and with it
   * the state's durability; a restart rebuilds the image from it.
   */
  private settleLater(state: QemuState): void {
    if (!state.delta || this.settling.has(state)) return;
    this.settling.add(state);
    const timer = setTimeout(() => {
      if (state.image.references === 0) return;
      const delta = join(this.imagesDir, `${state.id}.delta`);
      void syncAll([state.image.path], [], this.syncer)
        .then(async () => {
          state.delta = null;
          await rm(delta, { force: true });
        })
        .catch(() => undefined);
    }, this.settleDelayMs);
    timer.unref();
  }

  private layerFiles(layer: DiskLayer | null): { key: object; files: string[]; dirs: string[] }[] {
    return (layer?.chain() ?? []).map((l) => {
      if (l.id.startsWith('template-')) {
        // A cached template's layer, in its folder (`templates/<key>/disk.qcow2`).
        return { key: l, files: [l.path], dirs: [dirname(dirname(l.path))] };
      }
      return { key: l, files: [l.path, l.path.replace(/\.qcow2$/, '.json')], dirs: [] };
    });
  }

  /** The state `desc` names: the live one, or reopened from its files. */
  async open(desc: StateDescriptor): Promise<QemuState> {
    const known = this.live.get(desc.id);
    if (known) return known;
    if (desc.format !== STATE_FORMAT) {
      throw new Error(
        `state ${desc.id} has format ${desc.format}; this hostd reads ${STATE_FORMAT}`,
      );
    }
    const spec = desc.spec as MachineSpec;
    // Its memory holds the page cache of its own root filesystem: never restore it on another.
    await checkImageBuild(spec.image);
    if (desc.id.startsWith('template-')) {
      const state = await this.cachedTemplate(desc.id.slice('template-'.length), spec);
      if (!state)
        throw new Error(`the frozen template ${desc.id} is gone from ${this.templatesDir}`);
      return state;
    }
    if (!/^fork-[0-9a-f]{16}$/.test(desc.id)) throw new Error(`not a state id: ${desc.id}`);
    const state = await this.reopenOnce(desc.id, () => this.reopenFork(desc.id, spec));
    if (!state) throw new Error(`state ${desc.id} could not be reopened`);
    return state;
  }

  /** One reopening of state `id` at a time: a second asks the first (see `opening`). */
  private reopenOnce(
    id: string,
    reopen: () => Promise<QemuState | null>,
  ): Promise<QemuState | null> {
    const pending = this.opening.get(id);
    if (pending) return pending;
    const opening = reopen().finally(() => this.opening.delete(id));
    this.opening.set(id, opening);
    return opening;
  }

  private async reopenFork(id: string, spec: MachineSpec): Promise<QemuState> {
    const deviceState = await readBounded(join(this.imagesDir, `${id}.state`), MAX_DEVICE_STATE);
    const meta = JSON.parse(
      (await readBounded(join(this.imagesDir, `${id}.json`), 4096)).toString('utf8'),
    ) as { disk?: unknown; base?: unknown; boot?: unknown };
    if (meta.disk !== null && typeof meta.disk !== 'string') {
      throw new Error(`state ${id} names no disk layer`);
    }
    const image = join(this.imagesDir, `${id}.mem`);
    const deltaPath = join(this.imagesDir, `${id}.delta`);
    const base =
      typeof meta.base === 'string' && existsSync(deltaPath)
        ? await this.open({ format: STATE_FORMAT, id: meta.base, spec })
        : null;
    // Durable as a delta only: after a reboot, the image may be anything the power cut left,
    // and it is made again. In the same boot (hostd restarted) it is whole in the page cache,
    // and QEMUs adopted from before may map it (a pause finds its pages by its inode): kept.
    const boot = hostBootId();
    if (base && (boot === null || meta.boot !== boot)) {
      await this.rebuildImage(base, deltaPath, image, spec);
      // Made in this boot: a hostd restarted in it keeps this one (QEMUs may map it by then).
      const record = join(this.imagesDir, `${id}.json`);
      await writeDurably(record, Buffer.from(JSON.stringify({ ...meta, boot })));
    }
    const layer = meta.disk === null ? null : await this.disks.open(meta.disk);
    const state = this.adopt(id, spec, image, deviceState, false, layer);
    if (base) {
      // The delta on disk is the one `persistState` wrote and synced: it is not written again.
      state.delta = { base, runs: [] };
      this.deltasWritten.set(state, Promise.resolve());
      this.settleLater(state);
    }
    return state;
  }

  /** Makes `image` again as a copy of `base`'s with the pages of the delta at `deltaPath`. */
  private async rebuildImage(
    base: QemuState,
    deltaPath: string,
    image: string,
    spec: MachineSpec,
  ): Promise<void> {
    const part = `${image}.part`;
    await rm(part, { force: true });
    await MemImage.copy(base.image.path, part, this.group);
    try {
      await applyDeltaTo(deltaPath, part, spec.memoryMib * 1024 * 1024);
      await rename(part, image);
    } catch (err) {
      await rm(part, { force: true });
      throw err;
    }
  }

  /** A fresh, empty folder for a machine being paused. */
  async newPausedDir(): Promise<{ id: string; dir: string }> {
    const id = `pause-${randomBytes(8).toString('hex')}`;
    const dir = join(this.pausedDir, id);
    await mkdir(dir, { mode: 0o700 });
    return { id, dir };
  }

  /**
   * Registers a machine paused into `dir` (see vm/qemu/qemu-paused.ts): it takes over a reference to
   * `origin`, released when the paused machine is resumed or discarded.
   */
  addPaused(
    id: string,
    dir: string,
    origin: QemuState,
    deviceState: Buffer,
    size: number,
    disk: QemuPaused['disk'] = null,
  ): QemuPaused {
    this.livePaused.add(id);
    const gone = (): boolean => this.livePaused.delete(id);
    const diskBytes = disk ? this.disks.sizeBytes(disk.path) : 0;
    return new QemuPaused(id, dir, origin, deviceState, size + diskBytes, gone, disk);
  }

  /** The paused machine `desc` names, reopened from its files (with a reference to its origin). */
  async openPaused(desc: PausedDescriptor): Promise<QemuPaused> {
    if (desc.format !== STATE_FORMAT) {
      throw new Error(
        `paused machine ${desc.id} has format ${desc.format}; this hostd reads ${STATE_FORMAT}`,
      );
    }
    if (!/^pause-[0-9a-f]{16}$/.test(desc.id))
      throw new Error(`not a paused machine id: ${desc.id}`);
    const dir = join(this.pausedDir, desc.id);
    const deviceState = await readBounded(join(dir, 'device.state'), MAX_DEVICE_STATE);
    const size = (await stat(join(dir, 'memory.delta'))).size + deviceState.length;
    const origin = (await this.open(desc.origin)).retain();
    let disk: QemuPaused['disk'];
    try {
      disk = await this.disks.openPaused(dir);
    } catch (err) {
      origin.release();
      throw err;
    }
    return this.addPaused(desc.id, dir, origin, deviceState, size, disk);
  }

  describe(state: QemuState): StateDescriptor {
    return { format: STATE_FORMAT, id: state.id, spec: state.spec };
  }

  /**
   * Deletes the images and cached templates that no open state uses: what earlier runs left
   * behind (fork points of sandboxes that are gone, templates of older images). Call it once
   * every record has reopened what it needs.
   */
  async collectGarbage(): Promise<number> {
    let removed = 0;
    for (const name of await readdir(this.imagesDir)) {
      const id = name.replace(/\.(mem|state|json|delta)$/, '');
      if (this.live.has(id)) continue;
      await rm(join(this.imagesDir, name), { force: true });
      removed++;
    }
    for (const name of await readdir(this.templatesDir)) {
      if (this.live.has(`template-${name}`)) continue;
      await rm(join(this.templatesDir, name), { recursive: true, force: true });
      removed++;
    }
    for (const name of await readdir(this.pausedDir)) {
      if (this.livePaused.has(name)) continue;
      await rm(join(this.pausedDir, name), { recursive: true, force: true });
      removed++;
    }
    removed += (await this.builds?.collect((dir) => this.buildInUse(dir))) ?? 0;
    return removed + (await this.disks.collectGarbage());
  }

  private adopt(
    id: string,
    spec: MachineSpec,
    path: string,
    deviceState: Buffer,
    keep: boolean,
    layer: DiskLayer | null,
    incoming: Vm[] = [],
  ): QemuState {
    layer?.retain();
    const image = new MemImage(path, {
      keep,
      companions: keep
        ? []
        : ['state', 'json', 'delta', 'delta.part'].map((ext) =>
            join(this.imagesDir, `${id}.${ext}`),
          ),
      onFree: () => {
        this.live.delete(id);
        layer?.release();
        this.builds?.released(dirname(spec.image.rootfs), (dir) => this.buildInUse(dir));
      },
    });
    // A template's image is complete and punched from here on: its holes spare a pause or a
    // fork reading the base's zero pages (vm/storage/zero-pages.ts). A fork point's image learns
    // its own when a machine on it first pauses or forks (Vm), so that a fork does not pay the
    // walk of its new image while its children start.
    if (keep) image.learnZeroPages();
    const state = new QemuState(id, spec, image, deviceState, layer, incoming);
    this.live.set(id, state);
    return state;
  }
}
