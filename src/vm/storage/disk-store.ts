/**
 * VMs' writable disks on the host's disk, under the data directory, so that they outlive hostd
 * and cost host disk rather than RAM:
 *
 *   disks/top-<id>.qcow2, .json     a running VM's overlay, and the layer it sits on (its
 *                                    record: a hostd that restarts after a crash re-adopts the
 *                                    VM with it)
 *   disks/layer-<id>.qcow2, .json   frozen layers (vm/storage/disk-layer.ts) and the layer each sits on
 *   disks/.empty-<bytes>.qcow2      an empty overlay of each disk size, copied for every new one
 *   templates/<key>/disk.qcow2      a cached template's layer (vm/qemu/state-store.ts)
 *
 * A capture freezes a VM's overlay where it lies (a rename to a layer's name) and puts a fresh
 * overlay over it, so no disk data is ever copied. Overlays are copies of one empty qcow2 made
 * once per size with qemu-img: a fork makes one per child, and copying ~200 KB costs far less
 * than starting a process.
 */
import { execFile } from 'node:child_process';
import { statSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import {
  chmod,
  chown,
  copyFile,
  mkdir,
  open,
  readdir,
  readFile,
  rename,
  rm,
  stat,
  writeFile,
} from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { DiskLayer } from './disk-layer.js';

const run = promisify(execFile);

/** What a top's or layer's record holds. */
interface DiskRecord {
  /** The layer under it; null: directly over the template's empty disk. */
  readonly backing: string | null;
}

const LAYER_ID = /^layer-[0-9a-f]{16}$/;
const TOP_ID = /^top-[0-9a-f]{16}$/;
const TEMPLATE_ID = /^template-[0-9a-f]+$/;

export class DiskStore {
  readonly dir: string;
  private readonly live = new Map<string, DiskLayer>();
  private readonly liveTops = new Set<string>();
  private readonly empties = new Map<string, Promise<string>>();
  /** Layers being reopened from their records now, joined by further opens of the same. */
  private readonly opening = new Map<string, Promise<DiskLayer>>();

  constructor(
    dataDir: string,
    /** Where cached templates keep their layer (`templates/<key>/disk.qcow2`). */
    private readonly templatesDir: string,
    /**
     * The jailed QEMUs' group, when they run jailed: they read the layers through it; each
     * writes only its own overlay, which its own uid owns.
     */
    private readonly group?: number,
  ) {
    this.dir = join(dataDir, 'disks');
  }

  async init(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o750 });
    // A jailed QEMU may open the files it is given, never list, create or rename any here.
    if (this.group !== undefined) {
      await chown(this.dir, 0, this.group);
      await chmod(this.dir, 0o710);
    }
  }

  /** A fresh id for a VM's overlay. */
  newTopId(): string {
    return `top-${randomBytes(8).toString('hex')}`;
  }

  topPath(topId: string): string {
    return join(this.dir, `${topId}.qcow2`);
  }

  /**
   * Makes `path` an empty overlay as large as the template disk `base`, root's until a VM is
   * given it (QemuProcess chowns its overlay to its uid; a capture's comes with `uid`). It has
   * no backing of its own: QEMU is told its chain (vm/qemu/qemu-args.ts, DiskChain).
   */
  async newOverlay(base: string, path: string, uid?: number): Promise<void> {
    const empty = await this.emptyFor(base);
    await copyFile(empty, path);
    await chmod(path, 0o600);
    if (uid !== undefined) await chown(path, uid, uid);
  }

  /**
   * Creates the overlay of VM top `topId` over `backing` and records it; the VM holds the
   * caller's reference to `backing` until `dropTop`.
   */
  async createTop(topId: string, base: string, backing: DiskLayer | null): Promise<string> {
    const path = this.topPath(topId);
    this.liveTops.add(topId);
    try {
      await this.newOverlay(base, path);
      await this.recordTop(topId, backing);
    } catch (err) {
      await this.dropTop(topId);
      throw err;
    }
    return path;
  }

  /** Records which layer VM top `topId` sits on now (after a capture, or an incoming QEMU's restore). */
  async recordTop(topId: string, backing: DiskLayer | null): Promise<void> {
    this.liveTops.add(topId);
    await writeRecord(join(this.dir, `${topId}.json`), { backing: backing?.id ?? null });
  }

  /**
   * The layer a VM top that an earlier hostd made sits on (with a reference for the caller), for
   * its re-adoption after a crash.
   */
  async adoptTop(topId: string): Promise<DiskLayer | null> {
    if (!TOP_ID.test(topId)) throw new Error(`not a disk id: ${topId}`);
    const record = await readRecord(join(this.dir, `${topId}.json`));
    const backing = record.backing === null ? null : await this.open(record.backing);
    this.liveTops.add(topId);
    return backing?.retain() ?? null;
  }

  /** Deletes VM top `topId`'s files (the VM is gone, or its overlay became a layer). */
  async dropTop(topId: string): Promise<void> {
    this.liveTops.delete(topId);
    await rm(this.topPath(topId), { force: true });
    await rm(join(this.dir, `${topId}.json`), { force: true });
  }

  /** Makes the overlay at `path` VM top `topId`'s (a capture's new overlay) over `backing`. */
  async moveToTop(path: string, topId: string, backing: DiskLayer | null): Promise<void> {
    await rename(path, this.topPath(topId));
    await this.recordTop(topId, backing);
  }

  /** Moves VM top `topId`'s overlay to `dest` (a paused machine's folder) and forgets the top. */
  async moveTop(topId: string, dest: string): Promise<void> {
    await rename(this.topPath(topId), dest);
    // Paused, it is no VM's: its uid may go to another VM.
    if (this.group !== undefined) await chown(dest, 0, 0);
    await this.dropTop(topId);
  }

  async removeFile(path: string): Promise<void> {
    await rm(path, { force: true });
  }

  /** Records, in a paused machine's folder, the layer its `disk.qcow2` sits on. */
  async recordPaused(dir: string, backing: DiskLayer | null): Promise<void> {
    await writeRecord(join(dir, 'disk.json'), { backing: backing?.id ?? null });
  }

  /**
   * The overlay a paused machine's folder holds, if any, and the layer it sits on (with a
   * reference for the caller).
   */
  async openPaused(dir: string): Promise<{ path: string; layer: DiskLayer | null } | null> {
    const path = join(dir, 'disk.qcow2');
    let record: DiskRecord;
    try {
      record = await readRecord(join(dir, 'disk.json'));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
    await stat(path);
    const layer = record.backing === null ? null : (await this.open(record.backing)).retain();
    return { path, layer };
  }

  /**
   * Turns VM top `topId`'s overlay (which the VM no longer writes: it is stopped, or writes a new
   * overlay over it now) into a frozen layer over `backing`, taking over the caller's reference
   * to `backing`. The file is renamed, not copied: QEMU keeps reading it through its open
   * descriptor. The new layer has no references yet.
   */
  async freezeTop(topId: string, backing: DiskLayer | null): Promise<DiskLayer> {
    const id = `layer-${randomBytes(8).toString('hex')}`;
    const path = join(this.dir, `${id}.qcow2`);
    const recordPath = join(this.dir, `${id}.json`);
    await writeRecord(recordPath, { backing: backing?.id ?? null });
    await rename(this.topPath(topId), path);
    // No VM may write it any more (its capturing QEMU reopens it read-only, vm-disk.ts); QEMUs
    // read it through the group.
    if (this.group !== undefined) {
      await chown(path, 0, this.group);
      await chmod(path, 0o640);
    }
    return this.add(id, path, backing, [recordPath], false);
  }

  /**
   * A new layer holding everything `layer`'s chain holds, directly over the template's empty
   * disk `base` (which it is compared against, so only what differs is written). Read from the
   * frozen files while VMs run on them. No references yet.
   */
  async flatten(layer: DiskLayer, base: string): Promise<DiskLayer> {
    const id = `layer-${randomBytes(8).toString('hex')}`;
    const path = join(this.dir, `${id}.qcow2`);
    const recordPath = join(this.dir, `${id}.json`);
    const tmp = `${path}.tmp`;
    const files = [base, ...layer.chain().map((l) => l.path)].reverse();
    // The whole chain, top first, each layer naming the next as its backing.
    const source = files
      .map((file, i) => {
        const p = 'backing.'.repeat(i);
        return `${p}driver=qcow2,${p}file.driver=file,${p}file.filename=${file.replaceAll(',', ',,')}`;
      })
      .join(',');
    try {
      // -U: VMs hold the files open (read-only); nothing writes them.
      await run('qemu-img', [
        'convert',
        '-U',
        '--image-opts',
        source,
        '-O',
        'qcow2',
        '-B',
        base,
        '-F',
        'qcow2',
        tmp,
      ]);
      if (this.group !== undefined) {
        await chown(tmp, 0, this.group);
        await chmod(tmp, 0o640);
      }
      await writeRecord(recordPath, { backing: null });
      await rename(tmp, path);
    } catch (err) {
      await rm(tmp, { force: true });
      await rm(recordPath, { force: true });
      throw err;
    }
    return this.add(id, path, null, [recordPath], false);
  }

  /** Registers the layer of a cached template (`templates/<key>/disk.qcow2`), kept on disk. */
  templateLayer(key: string): DiskLayer {
    const id = `template-${key}`;
    return (
      this.live.get(id) ?? this.add(id, join(this.templatesDir, key, 'disk.qcow2'), null, [], true)
    );
  }

  /**
   * The layer `id` names: the live one, or reopened from its record (with its backing chain).
   * Opens of one layer at once (two sandboxes on one fork point moving in together, a start
   * reopening siblings) share one reopening: each would otherwise register the layer, and the
   * second found it live and took it for a record naming itself.
   */
  async open(id: string): Promise<DiskLayer> {
    return this.openIn(id, new Set());
  }

  /** `open`, within the chain of layers `above` being reopened (a record naming one is refused). */
  private async openIn(id: string, above: ReadonlySet<string>): Promise<DiskLayer> {
    const known = this.live.get(id);
    if (known) return known;
    if (TEMPLATE_ID.test(id)) return this.templateLayer(id.slice('template-'.length));
    if (!LAYER_ID.test(id)) throw new Error(`not a disk layer id: ${id}`);
    if (above.has(id)) throw new Error(`disk layer ${id} is its own backing`);
    const pending = this.opening.get(id);
    if (pending) return pending;
    const opening = this.reopen(id, new Set([...above, id])).finally(() => this.opening.delete(id));
    this.opening.set(id, opening);
    return opening;
  }

  private async reopen(id: string, chain: ReadonlySet<string>): Promise<DiskLayer> {
    const record = await readRecord(join(this.dir, `${id}.json`));
    const path = join(this.dir, `${id}.qcow2`);
    await stat(path);
    const backing =
      record.backing === null ? null : (await this.openIn(record.backing, chain)).retain();
    return this.add(id, path, backing, [join(this.dir, `${id}.json`)], false);
  }

  /** Bytes `layer`'s own file takes on disk (not its backing's). */
  sizeBytes(path: string): number {
    return fileBytes(path);
  }

  /**
   * Deletes the layers and overlays no open layer or VM uses: what earlier runs left behind.
   * Call it once every record has reopened what it needs.
   */
  async collectGarbage(): Promise<number> {
    let removed = 0;
    for (const name of await readdir(this.dir)) {
      if (name.startsWith('.empty-')) continue;
      const id = name.replace(/\.(qcow2|json|tmp)$/, '');
      if (this.live.has(id) || this.liveTops.has(id)) continue;
      await rm(join(this.dir, name), { force: true });
      removed++;
    }
    return removed;
  }

  private add(
    id: string,
    path: string,
    backing: DiskLayer | null,
    companions: string[],
    keep: boolean,
  ): DiskLayer {
    const layer = new DiskLayer(id, path, backing, {
      keep,
      companions,
      onFree: () => this.live.delete(id),
    });
    this.live.set(id, layer);
    return layer;
  }

  /** An empty qcow2 as large as `base` (made once per size), to copy for each new overlay. */
  private emptyFor(base: string): Promise<string> {
    let made = this.empties.get(base);
    if (!made) {
      made = (async () => {
        const bytes = await virtualSize(base);
        const path = join(this.dir, `.empty-${bytes}.qcow2`);
        const tmp = `${path}.${process.pid}`;
        await run('qemu-img', ['create', '-q', '-f', 'qcow2', tmp, String(bytes)]);
        await rename(tmp, path);
        return path;
      })();
      // A failure is the caller's (it awaits `made`); only the memo goes, so the next call retries.
      made.catch(() => this.empties.delete(base));
      this.empties.set(base, made);
    }
    return made;
  }
}

/** The virtual size of a qcow2 image: big-endian 64 bits at offset 24 of its header. */
async function virtualSize(path: string): Promise<bigint> {
  const fh = await open(path, 'r');
  try {
    const header = Buffer.alloc(32);
    await fh.read(header, 0, 32, 0);
    if (header.readUInt32BE(0) !== 0x514649fb) throw new Error(`${path} is not a qcow2 image`);
    return header.readBigUInt64BE(24);
  } finally {
    await fh.close();
  }
}

function fileBytes(path: string): number {
  try {
    return statSync(path).blocks * 512;
  } catch {
    // Expected: a file deleted meanwhile takes no space.
    return 0;
  }
}

async function writeRecord(path: string, record: DiskRecord): Promise<void> {
  // Not fsynced: a record matters after a crash of hostd, whose VMs run on and whose files
  // stay in the page cache; after a host crash the VMs it describes are gone anyway.
  await writeFile(`${path}.tmp`, JSON.stringify(record), { mode: 0o640 });
  await rename(`${path}.tmp`, path);
}

async function readRecord(path: string): Promise<DiskRecord> {
  const raw = JSON.parse(await readFile(path, 'utf8')) as { backing?: unknown };
  if (raw.backing !== null && typeof raw.backing !== 'string') {
    throw new Error(`${path}: not a disk record`);
  }
  return { backing: raw.backing };
}
