/**
 * One VM's writable disk: its own qcow2 overlay (a "top", vm/storage/disk-store.ts) over a chain of
 * frozen layers (vm/storage/disk-layer.ts) ending in the template's empty disk. The VM holds a reference
 * to the layer its overlay sits on for as long as it runs.
 *
 * The QMP side of the disk's life:
 * - a fork standby QEMU starts before its state is known, on an overlay with no backing; `attach`
 *   adds the state's layers (`blockdev-add`) and makes them the overlay's backing
 *   (`blockdev-reopen`) before the device state loads, so the guest never saw the difference;
 * - a capture (fork, snapshot) freezes the overlay as a layer of the new state and puts a fresh
 *   overlay over it (`blockdev-add`, then `blockdev-snapshot` inside the pause window, so disk and
 *   memory are captured at one instant); `stop` has already drained and flushed QEMU's writes.
 */
import { statSync } from 'node:fs';
import { link } from 'node:fs/promises';
import { join } from 'node:path';
import type { DiskLayer } from '../storage/disk-layer.js';
import type { DiskStore } from '../storage/disk-store.js';
import type { FileView } from '../host/vm-view.js';
import { DISK_TOP_NODE, diskLayerNode, type DiskChain } from './qemu-args.js';
import type { QmpClient } from './qmp.js';

/**
 * The QEMU a disk is attached to: its QMP, the uid a jailed one runs as, and the names it opens
 * files by (its view: every file a `blockdev-add` names is exposed there first).
 */
export interface DiskQemu {
  readonly qmp: QmpClient;
  readonly uid: number | undefined;
  readonly view: FileView;
}

/** A capture's new overlay, added to QEMU but not yet over the old one. */
export interface PendingOverlay {
  /** Inside the pause window: the new overlay goes over the current one. */
  stack(): Promise<void>;
  /**
   * After `stack`: the old overlay becomes a frozen layer (returned, without references of its
   * own) and the VM writes the new one.
   */
  commit(): Promise<DiskLayer>;
  /** Before `stack`, or when it failed: removes the new overlay. */
  abandon(): Promise<void>;
}

export class VmDisk {
  private released = false;
  private nextNode = 1;
  /**
   * Node names of the read-only layers above the template's empty disk, top first, as this
   * hostd added them: after a flattening they are deleted from QEMU so that it closes their
   * files. Unknown for a VM adopted after a crash (its old layers then stay open until it ends).
   */
  private layerNodes: string[] = [];
  /** False for a VM adopted after a crash: the node names under its overlay are not known. */
  private chainKnown = true;
  /** Files of the layers `preopen` opened in QEMU ahead of `attach`, bottom first. */
  private readonly preopened: string[] = [];

  private constructor(
    private readonly disks: DiskStore,
    /** The template's empty disk, under every layer. */
    private readonly base: string,
    /** Names this VM's overlay (`disks/<topId>.qcow2`) and its record. */
    readonly topId: string,
    /** The layer the overlay sits on (retained), null when it is directly over `base`. */
    private backing: DiskLayer | null,
    /** False while the overlay has no backing at all (an incoming QEMU before `attach`). */
    private attached: boolean,
    /** QEMU's node name of the overlay the guest writes. */
    private topNode = DISK_TOP_NODE,
  ) {}

  /** A new overlay over `backing`, whose reference it takes over from the caller. */
  static async create(disks: DiskStore, base: string, backing: DiskLayer | null): Promise<VmDisk> {
    const topId = disks.newTopId();
    try {
      await disks.createTop(topId, base, backing);
    } catch (err) {
      backing?.release();
      throw err;
    }
    return new VmDisk(disks, base, topId, backing, true);
  }

  /** A new overlay with no backing yet, for a QEMU whose state is not known (`attach`). */
  static async unattached(disks: DiskStore, base: string): Promise<VmDisk> {
    const topId = disks.newTopId();
    await disks.createTop(topId, base, null);
    return new VmDisk(disks, base, topId, null, false);
  }

  /**
   * The overlay a paused machine left (`pausedDisk`, over `backing`, whose reference it takes
   * over), linked under a new top's name: the paused files keep theirs until they are discarded.
   */
  static async fromPaused(
    disks: DiskStore,
    base: string,
    pausedDisk: string,
    backing: DiskLayer | null,
  ): Promise<VmDisk> {
    const topId = disks.newTopId();
    try {
      await link(pausedDisk, disks.topPath(topId));
      await disks.recordTop(topId, backing);
    } catch (err) {
      await disks.dropTop(topId);
      backing?.release();
      throw err;
    }
    return new VmDisk(disks, base, topId, backing, true);
  }

  /**
   * The disk of a VM an earlier hostd started (re-adoption after a crash). Its chain's node
   * names are read from QEMU's block graph, so that a later capture can reopen the overlay it
   * freezes read-only and a flattening can close the old layers, as for a VM this hostd started.
   */
  static async adopt(
    disks: DiskStore,
    base: string,
    topId: string,
    qmp: QmpClient,
  ): Promise<VmDisk> {
    const backing = await disks.adoptTop(topId);
    const blocks = (await qmp.execute('query-block')) as { inserted?: { 'node-name'?: string } }[];
    const top = blocks
      .map((b) => b.inserted?.['node-name'])
      .find((n) => n !== undefined && n !== 'rootfs');
    const disk = new VmDisk(disks, base, topId, backing, true, top ?? DISK_TOP_NODE);
    // Node names this hostd adds must not collide with the earlier run's.
    disk.nextNode = 1000;
    // Expected to fail only on a QEMU without the (unstable, x-) graph query: the VM is adopted
    // all the same, and its captures leave the descriptor as it is (chainKnown).
    const chain = top === undefined ? null : await backingChain(qmp, top).catch(() => null);
    // The template's empty disk, at the bottom, keeps its name (flatten puts layers on it).
    if (chain && chain.at(-1) === diskLayerNode(0)) disk.layerNodes = chain.slice(0, -1);
    else disk.chainKnown = false;
    return disk;
  }

  /** The chain QEMU opens at start (vm/qemu/qemu-args.ts). */
  chain(): DiskChain {
    const layers = this.attached ? this.layerPaths(this.backing) : [];
    this.layerNodes = layers
      .slice(1)
      .map((_, i) => diskLayerNode(i + 1))
      .reverse();
    return { top: this.disks.topPath(this.topId), layers };
  }

  /** Frozen layers under the overlay, not counting the template's empty disk. */
  get depth(): number {
    return this.backing?.chain().length ?? 0;
  }

  /** The layer the overlay sits on now (a paused machine's origin of its disk). */
  get layer(): DiskLayer | null {
    return this.backing;
  }

  get isAttached(): boolean {
    return this.attached;
  }

  /**
   * Gives an unattached overlay (an incoming QEMU, not yet running) the backing `layer`, whose
   * reference it takes over. The guest has not run, so it sees the chain from its first read.
   */
  async attach(qemu: DiskQemu, layer: DiskLayer | null): Promise<void> {
    if (this.attached) throw new Error('disk attached twice');
    const { qmp } = qemu;
    const paths = this.layerPaths(layer);
    try {
      const from = await this.usePreopened(qmp, paths);
      for (const [i, path] of paths.entries()) {
        if (i >= from) await this.addLayerNode(qemu, i, path);
      }
      await qmp.execute('blockdev-reopen', {
        options: [
          {
            driver: 'qcow2',
            'node-name': this.topNode,
            file: 'disk-file',
            backing: diskLayerNode(paths.length - 1),
          },
        ],
      });
      await this.disks.recordTop(this.topId, layer);
    } catch (err) {
      layer?.release();
      throw err;
    }
    this.backing = layer;
    this.attached = true;
    this.layerNodes = paths
      .slice(1)
      .map((_, i) => diskLayerNode(i + 1))
      .reverse();
  }

  /**
   * Opens in QEMU, ahead of `attach`, the read-only layers of the chain this unattached overlay
   * will most likely sit on: `layer`'s (bottom first, under the node names `attach` gives them).
   * A fork standby's QEMU (vm/qemu/fork-target.ts) does this when it starts, for its template's
   * layer, under which every fork of a sandbox of that template has its own: in the fork only
   * that one is added, and each child's restore makes two fewer `blockdev-add`s (each QEMU opening
   * a qcow2 file, and hostd linking it into a jailed QEMU's view and out again) while the children
   * compete for the host's cores (docs/architecture.md, "Fork: the host's part of a child").
   * Nothing the guest can see: the overlay has no backing until `attach`.
   */
  async preopen(qemu: DiskQemu, layer: DiskLayer | null): Promise<void> {
    if (this.attached || this.preopened.length > 0) return;
    const paths = this.layerPaths(layer);
    for (const [i, path] of paths.entries()) {
      await this.addLayerNode(qemu, i, path);
      this.preopened.push(path);
    }
  }

  /**
   * How many of `paths` (bottom first) QEMU has open already (`preopen`): a prefix of them. Layers
   * opened ahead that are not (a parent whose chain was flattened) are closed, top first, so that
   * `attach` can add the whole chain under its usual node names.
   */
  private async usePreopened(qmp: QmpClient, paths: readonly string[]): Promise<number> {
    const opened = this.preopened.splice(0);
    if (opened.every((p, i) => paths[i] === p)) return opened.length;
    for (let i = opened.length - 1; i >= 0; i--) {
      await qmp.execute('blockdev-del', { 'node-name': diskLayerNode(i) });
    }
    return 0;
  }

  /** Adds read-only layer `index` of the chain (bottom first), the file `path`, to QEMU. */
  private async addLayerNode(qemu: DiskQemu, i: number, path: string): Promise<void> {
    const filename = await qemu.view.expose(path);
    try {
      await qemu.qmp.execute('blockdev-add', {
        driver: 'qcow2',
        'node-name': diskLayerNode(i),
        'read-only': true,
        file: { driver: 'file', filename },
        ...(i > 0 ? { backing: diskLayerNode(i - 1) } : {}),
      });
    } finally {
      await qemu.view.withdraw(filename);
    }
  }

  /**
   * Adds a fresh overlay to QEMU for a capture (see `PendingOverlay`); the guest may run. A
   * jailed QEMU gets it owned by its `uid`.
   */
  async prepareCapture(qemu: DiskQemu): Promise<PendingOverlay> {
    const { disks } = this;
    const { qmp, uid } = qemu;
    const node = `disk-t${this.nextNode++}`;
    // Named after its node: the name QEMU knows its file by, once it is renamed to the top's
    // (`reopenReadOnly` needs it).
    const path = this.fileOfNode(node);
    const fileNode = fileNodeOf(node);
    await disks.newOverlay(this.base, path, uid);
    const added: string[] = [];
    const remove = async (): Promise<void> => {
      for (const n of added.reverse()) {
        // Undoing a failed capture, whose own error is the one reported. Expected to fail only
        // on a QEMU that is gone or failing; a node left in it costs an open file until it ends.
        await qmp.execute('blockdev-del', { 'node-name': n }).catch(() => undefined);
      }
      await disks.removeFile(path);
    };
    try {
      const filename = await qemu.view.expose(path);
      try {
        await qmp.execute('blockdev-add', { driver: 'file', 'node-name': fileNode, filename });
      } finally {
        await qemu.view.withdraw(filename);
      }
      added.push(fileNode);
      await qmp.execute('blockdev-add', {
        driver: 'qcow2',
        'node-name': node,
        file: fileNode,
        backing: null,
      });
      added.push(node);
    } catch (err) {
      await remove();
      throw err;
    }
    let stacked = false;
    return {
      stack: async () => {
        await qmp.execute('blockdev-snapshot', { node: this.topNode, overlay: node });
        stacked = true;
      },
      commit: async () => {
        await this.reopenReadOnly(qmp);
        const layer = await disks.freezeTop(this.topId, this.backing);
        await disks.moveToTop(path, this.topId, layer);
        this.backing = layer.retain();
        this.layerNodes.unshift(this.topNode);
        this.topNode = node;
        return layer;
      },
      abandon: async () => {
        if (!stacked) await remove();
      },
    };
  }

  /**
   * Has QEMU reopen the overlay it no longer writes (a capture stacked a new one over it)
   * read-only, before it is renamed into a layer: otherwise QEMU keeps the read-write descriptor
   * it opened it with, and a QEMU taken over by its guest could change the disk of the children
   * that read that layer. QEMU reopens by the name it first opened the file by (asked of it: a
   * view's name, or for a QEMU from before views a host name that a capture's overlay may no
   * longer have), so the overlay is linked there for the reopen. Not done for an adopted VM
   * whose chain QEMU did not tell (`adopt`): it keeps the descriptor.
   */
  private async reopenReadOnly(qmp: QmpClient): Promise<void> {
    if (!this.chainKnown) return;
    const top = this.disks.topPath(this.topId);
    const fileNode = fileNodeOf(this.topNode);
    const known = await fileNameOf(qmp, fileNode);
    if (known !== top) await link(top, known);
    try {
      await qmp.execute('blockdev-reopen', {
        options: [
          { driver: 'file', 'node-name': fileNode, filename: known, 'read-only': true },
          {
            driver: 'qcow2',
            'node-name': this.topNode,
            file: fileNode,
            backing: this.layerNodes[0] ?? diskLayerNode(0),
            'read-only': true,
          },
        ],
      });
    } finally {
      if (known !== top) await this.disks.removeFile(known);
    }
  }

  /** The file QEMU opened for overlay node `node`: the top's for the first, its own for later. */
  private fileOfNode(node: string): string {
    return node === DISK_TOP_NODE
      ? this.disks.topPath(this.topId)
      : join(this.disks.dir, `${this.topId}.${node}.qcow2`);
  }

  /**
   * Replaces the chain under the overlay by one layer holding all of it, so that chains do not
   * grow without bound (each capture adds a layer under the capturing VM). The new layer is
   * made from the frozen chain while the guest runs, then put under the overlay in its place
   * (`blockdev-reopen`: same data, so the guest cannot tell). Returns it, retained by this VM;
   * the old chain is freed when no one else reads it. Keeps the old chain on failure.
   */
  async flatten(qemu: DiskQemu): Promise<DiskLayer | null> {
    const old = this.backing;
    if (!old) return null;
    const { qmp } = qemu;
    const flat = (await this.disks.flatten(old, this.base)).retain();
    const node = `disk-m${this.nextNode++}`;
    try {
      const filename = await qemu.view.expose(flat.path);
      try {
        await qmp.execute('blockdev-add', {
          driver: 'qcow2',
          'node-name': node,
          'read-only': true,
          file: { driver: 'file', filename },
          backing: diskLayerNode(0),
        });
      } finally {
        await qemu.view.withdraw(filename);
      }
      await qmp.execute('blockdev-reopen', {
        options: [
          {
            driver: 'qcow2',
            'node-name': this.topNode,
            file: fileNodeOf(this.topNode),
            backing: node,
          },
        ],
      });
      await this.disks.recordTop(this.topId, flat);
    } catch (err) {
      // Undoing the failed flattening (see `remove` in prepareCapture for why this may fail).
      await qmp.execute('blockdev-del', { 'node-name': node }).catch(() => undefined);
      flat.release();
      throw err;
    }
    this.backing = flat;
    // Nothing reads the old layers' nodes now: deleting them, top first, closes their files.
    // Expected to fail only on a QEMU that is gone or failing: the guest's disk is the flat
    // layer already, and a node left open costs an open file until the VM ends.
    for (const n of this.layerNodes.splice(0, this.layerNodes.length, node)) {
      await qmp.execute('blockdev-del', { 'node-name': n }).catch(() => undefined);
      if (n === DISK_TOP_NODE || n.startsWith('disk-t')) {
        await qmp.execute('blockdev-del', { 'node-name': fileNodeOf(n) }).catch(() => undefined);
      }
    }
    old.release();
    return flat;
  }

  /**
   * Moves the (stopped) VM's overlay into a paused machine's folder, as `disk.qcow2`, and hands
   * over the reference to its layer: the VM no longer owns a disk.
   */
  async moveToPaused(dir: string): Promise<{ path: string; layer: DiskLayer | null }> {
    const path = join(dir, 'disk.qcow2');
    await this.disks.moveTop(this.topId, path);
    this.released = true;
    const layer = this.backing;
    this.backing = null;
    return { path, layer };
  }

  /**
   * Bytes the overlay and the layers under it take on the host's disk (sparse files: blocks).
   * Synchronous: the files are open in QEMU, so their inodes are cached (Vm.usage says why).
   * One that cannot be read counts 0, as before.
   */
  allocatedBytes(): number {
    let total = 0;
    for (const p of [this.disks.topPath(this.topId), ...this.layerPaths(this.backing)]) {
      try {
        total += (statSync(p, { throwIfNoEntry: false })?.blocks ?? 0) * 512;
      } catch {
        /* unreadable: 0, as a missing file */
      }
    }
    return total;
  }

  /** Deletes the overlay and lets go of its layer. Idempotent. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    await this.disks.dropTop(this.topId);
    this.backing?.release();
    this.backing = null;
  }

  /** Files of the read-only part of a chain ending in `layer`, bottom first. */
  private layerPaths(layer: DiskLayer | null): string[] {
    return [this.base, ...(layer?.chain() ?? []).map((l) => l.path)];
  }
}

/**
 * The node name of the file under qcow2 node `node`: `blockdev-reopen` must name it. The overlay
 * a VM starts with has the command line's; a capture's overlays get `<node>-file`.
 */
function fileNodeOf(node: string): string {
  return node === DISK_TOP_NODE ? 'disk-file' : `${node}-file`;
}

/** The file name QEMU opened file node `node` by. */
async function fileNameOf(qmp: QmpClient, node: string): Promise<string> {
  const nodes = (await qmp.execute('query-named-block-nodes', { flat: true })) as {
    'node-name'?: string;
    drv?: string;
    file?: string;
  }[];
  const file = nodes.find((n) => n['node-name'] === node && n.drv === 'file')?.file;
  if (file === undefined) throw new Error(`QEMU has no file node ${node}`);
  return file;
}

/**
 * The qcow2 nodes of the chain under node `top`, nearest first, from QEMU's block graph; null
 * when the graph is not a plain chain.
 */
async function backingChain(qmp: QmpClient, top: string): Promise<string[] | null> {
  const graph = (await qmp.execute('x-debug-query-block-graph')) as {
    nodes: { id: number; name: string }[];
    edges: { parent: number; child: number; name: string }[];
  };
  const byName = new Map(graph.nodes.map((n) => [n.name, n.id]));
  const names = new Map(graph.nodes.map((n) => [n.id, n.name]));
  const chain: string[] = [];
  let id = byName.get(top);
  while (id !== undefined) {
    const parent = id;
    const next = graph.edges.find((e) => e.parent === parent && e.name === 'backing')?.child;
    if (next === undefined) break;
    const name = names.get(next);
    if (name === undefined || chain.includes(name)) return null;
    chain.push(name);
    id = next;
  }
  return chain;
}
