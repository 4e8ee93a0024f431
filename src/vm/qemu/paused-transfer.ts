/**
 * A paused machine carried to another node (a hand-over, docs/cluster.md): the exporting node
 * lists every file the machine needs (vm/machine.ts, PausedManifest) and serves them; the
 * importing node fetches the parts it lacks and puts each in place whole or not at all.
 *
 * A paused machine needs its own folder (`paused/<id>/`), its origin state (a template's frozen
 * boot, `templates/<key>/`, or a fork point, `images/<id>.*`) and the disk layers under its
 * overlay (`disks/layer-<id>.*`, down to a template's `disk.qcow2`). Every id is random or a hash
 * of what shapes the state, so a part found here by id is the same part: it is reused, never
 * fetched again. The template build the state runs on (its memory holds the page cache of that
 * build's root filesystem) is the node's own when its files are the source's; otherwise the
 * source's build is fetched into the image cache and the state restored onto it
 * (vm/image/build-copies.ts), before any other part.
 *
 * Files are fetched to `<name>.part` beside where they go (or into a staging folder, for the
 * folders of a template and of the paused machine), checked against their size and sha256, and
 * renamed into place, the file that makes a part visible to `StateStore` last (a record, a
 * template's `complete`). A fetch that broke off resumes from the bytes already there; what an
 * import left unfinished is removed by the next start's garbage collection.
 */
import { createHash } from 'node:crypto';
import { constants, createReadStream, createWriteStream, existsSync } from 'node:fs';
import { chmod, chown, mkdir, open, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import type {
  ExportedBuild,
  ExportedFile,
  ExportedPart,
  ExportedRead,
  FileFetcher,
  PausedManifest,
  StateDescriptor,
  StateManifest,
} from '../machine.js';
import {
  BUILD_FILES,
  fileName,
  readBuildManifest,
  type BuildCopies,
} from '../image/build-copies.js';
import { checkImageBuild, type GuestImage } from '../image/image.js';
import { STATE_FORMAT } from '../storage/state-format.js';
import { syncFile } from '../storage/safe-files.js';
import type { DiskLayer } from '../storage/disk-layer.js';
import { VmError } from '../vm-error.js';
import type { MachineSpec } from './qemu-args.js';
import type { QemuPaused } from './qemu-paused.js';
import type { QemuState } from './qemu-state.js';
import type { StateStore } from './state-store.js';

/** The files an export may name, relative to the data directory; nothing else is served. */
const EXPORTABLE = [
  /^paused\/pause-[0-9a-f]{16}\/(memory\.delta|device\.state|disk\.qcow2|disk\.json)$/,
  /^images\/fork-[0-9a-f]{16}\.(mem|state|json)$/,
  /^templates\/[0-9a-f]{8,64}\/(memory\.img|device\.state|disk\.qcow2|complete)$/,
  /^disks\/layer-[0-9a-f]{16}\.(qcow2|json)$/,
];

/** How often one file's fetch is tried (each try resumes where the last broke off). */
const FETCH_TRIES = 3;

/** sha256 of files that do not change once written (states, layers), by path and identity. */
const digests = new Map<string, { key: string; sha256: string }>();

export function isExportable(path: string): boolean {
  return EXPORTABLE.some((re) => re.test(path));
}

/**
 * The folder of the template build an imported state runs on here, pinned (never collected)
 * until the state is open on it (`StateStore.unpinBuild`).
 */
interface BuildAt {
  readonly dir: string;
}

export class PausedTransfer {
  /** Parts being imported now, by id: a second import of one waits for the first. */
  private readonly importing = new Map<string, Promise<void>>();

  constructor(
    private readonly store: StateStore,
    /** The jailed QEMUs' group, when they run jailed: they read states and layers through it. */
    private readonly group?: number,
    /** The image cache's copied builds; without it builds are neither served nor fetched. */
    private readonly builds?: BuildCopies,
  ) {}

  async export(paused: QemuPaused): Promise<PausedManifest> {
    const parts = await this.stateParts(paused.origin, paused.disk?.layer ?? null);
    const files: ExportedFile[] = [];
    for (const file of this.store.pausedFiles(paused.dir, paused.disk !== null))
      files.push(await this.describeFile(`paused/${paused.id}/${basename(file)}`, false));
    parts.push({ kind: 'paused', id: paused.id, files });
    const build = await this.exportBuild(paused.origin.spec.image);
    return { format: STATE_FORMAT, paused: paused.describe(), parts, ...(build ? { build } : {}) };
  }

  /** A frozen state alone (a snapshot's): its own files and its disk layer chain. */
  async exportState(state: QemuState): Promise<StateManifest> {
    const parts = await this.stateParts(state, null);
    const build = await this.exportBuild(state.spec.image);
    return {
      format: STATE_FORMAT,
      state: this.store.describe(state),
      parts,
      ...(build ? { build } : {}),
    };
  }

  /**
   * The template build `image` names, for a target whose own differs: its files with the sizes
   * and sha256 its manifest records (the builder hashed them; an import checks what arrives).
   * None when it is not in this node's image cache under the builder's names, or no longer
   * the build the state was made on: the target must then have that build itself.
   */
  private async exportBuild(image: GuestImage): Promise<ExportedBuild | undefined> {
    const builds = this.builds;
    if (!builds) return undefined;
    const dir = dirname(image.rootfs);
    const names = [image.kernel, image.initrd, image.rootfs, ...(image.disk ? [image.disk] : [])];
    if (names.some((p) => dirname(p) !== dir || !BUILD_FILES.some((n) => basename(p) === n))) {
      return undefined;
    }
    const manifest = await readBuildManifest(dir); // null: a build gone, or not the builder's
    if (manifest === null || manifest.key !== image.key || typeof manifest.name !== 'string')
      return undefined;
    const files: ExportedFile[] = [];
    for (const name of [...names.map((p) => basename(p)), 'manifest.json']) {
      const path = builds.exportName(dir, name);
      if (!path) return undefined;
      const known = manifest.files?.[name];
      const size = (await stat(join(dir, name))).size;
      if (known && known.size_bytes === size && typeof known.sha256 === 'string') {
        files.push({ path, size, sha256: known.sha256 });
      } else {
        files.push({ path, size, sha256: await hashFile(join(dir, name)) });
      }
    }
    return { template: manifest.name, key: image.key, files };
  }

  /**
   * The parts `origin` needs, in the order an import puts them in place: a template's frozen
   * boot, the layers under it, then (for a paused machine) those under `disk`, then the fork
   * point itself.
   */
  private async stateParts(origin: QemuState, disk: DiskLayer | null): Promise<ExportedPart[]> {
    const parts: ExportedPart[] = [];
    const seen = new Set<string>();
    const add = async (kind: ExportedPart['kind'], id: string, names: string[]): Promise<void> => {
      if (seen.has(id)) return;
      seen.add(id);
      const files: ExportedFile[] = [];
      for (const name of names) files.push(await this.describeFile(name, true));
      parts.push({ kind, id, files });
    };
    const addTemplate = (key: string, withDisk: boolean): Promise<void> =>
      add('state', `template-${key}`, [
        `templates/${key}/memory.img`,
        `templates/${key}/device.state`,
        ...(withDisk ? [`templates/${key}/disk.qcow2`] : []),
        `templates/${key}/complete`,
      ]);
    const addLayers = async (layer: DiskLayer | null): Promise<void> => {
      for (const l of layer?.chain() ?? []) {
        if (l.id.startsWith('template-')) await addTemplate(l.id.slice('template-'.length), true);
        else await add('layer', l.id, [`disks/${l.id}.qcow2`, `disks/${l.id}.json`]);
      }
    };
    const spec = origin.spec;
    if (origin.id.startsWith('template-')) {
      await addTemplate(origin.id.slice('template-'.length), Boolean(spec.image.disk));
    }
    await addLayers(origin.layer);
    await addLayers(disk);
    if (!origin.id.startsWith('template-')) {
      await add(
        'state',
        origin.id,
        ['mem', 'state', 'json'].map((ext) => `images/${origin.id}.${ext}`),
      );
    }
    return parts;
  }

  async read(path: string, offset: number): Promise<ExportedRead> {
    const full = isExportable(path)
      ? join(this.store.dataDir, path)
      : (this.builds?.exportedPath(path) ?? null);
    if (full === null) throw new VmError('unsupported', `not an exported file: ${path}`);
    const fh = await open(full, constants.O_RDONLY | constants.O_NOFOLLOW);
    try {
      const st = await fh.stat();
      if (!st.isFile()) throw new VmError('unsupported', `not a regular file: ${path}`);
      const start = Math.min(Math.max(0, offset), st.size);
      // The stream owns the descriptor from here: it closes it when it ends or is destroyed.
      const stream = fh.createReadStream({ start, autoClose: true });
      return { size: st.size, stream };
    } catch (err) {
      await fh.close();
      throw err;
    }
  }

  async import(manifest: PausedManifest, fetch: FileFetcher): Promise<QemuPaused> {
    if (!manifest.parts.some((p) => p.kind === 'paused' && p.id === manifest.paused.id)) {
      throw new VmError('state_corrupt', `the export lacks paused machine ${manifest.paused.id}`);
    }
    const origin = manifest.paused.origin;
    const { renamed, build } = await this.importParts(manifest, origin, fetch);
    try {
      const originAs = renamed.get(origin.id)?.state ?? origin.id;
      const spec = onBuild(origin.spec as MachineSpec, build?.dir);
      const paused = await this.store.openPaused({
        ...manifest.paused,
        origin: { ...origin, id: originAs, spec },
      });
      // Durable before the record that takes it over is written (each file was synced as it
      // came; a record rewritten for a renamed template and the entries naming them were not).
      try {
        await this.store.persistPaused(
          this.store.pausedFiles(paused.dir, paused.disk !== null),
          [this.store.pausedDir],
          paused.origin,
          paused.disk?.layer ?? null,
        );
      } catch (err) {
        await paused.discard();
        throw err;
      }
      return paused;
    } finally {
      if (build) this.store.unpinBuild(build.dir);
    }
  }

  /** A frozen state alone (a snapshot's), opened once its parts are here. */
  async importState(manifest: StateManifest, fetch: FileFetcher): Promise<QemuState> {
    if (manifest.parts.some((p) => p.kind === 'paused')) {
      throw new VmError('state_corrupt', 'the export of a state names a paused machine');
    }
    const state = manifest.state;
    const { renamed, build } = await this.importParts(manifest, state, fetch);
    try {
      const spec = onBuild(state.spec as MachineSpec, build?.dir);
      const opened = await this.store.open({
        ...state,
        id: renamed.get(state.id)?.state ?? state.id,
        spec,
      });
      // Durable before the snapshot's record is written (see `import`).
      try {
        await this.store.persistState(opened);
      } catch (err) {
        // Not kept: its files go now, unless something here holds the state already.
        opened.retain().release();
        throw err;
      }
      return opened;
    } finally {
      if (build) this.store.unpinBuild(build.dir);
    }
  }

  /**
   * Where the template build the exported state runs on is on this node, fetched first when
   * this node lacks it (`BuildCopies.obtain`): null when the state keeps the paths it names
   * (an export without its build, from an older node: that very build must be there).
   */
  private async placeBuild(
    image: GuestImage,
    build: ExportedBuild | undefined,
    fetch: FileFetcher,
  ): Promise<BuildAt | null> {
    if (build && this.builds) {
      checkBuild(build, image);
      const dir = await this.builds.obtain(build, (file, to) =>
        this.fetchFile(file, to, false, fetch),
      );
      return { dir };
    }
    try {
      await checkImageBuild(image);
    } catch (err) {
      throw new VmError('state_corrupt', (err as Error).message, { cause: err });
    }
    return null;
  }

  /**
   * Puts in place the parts this node lacks, after the checks no byte is fetched before; returns
   * the templates taken in as fork points of their own (see below), by their exported ids.
   */
  private async importParts(
    manifest: PausedManifest | StateManifest,
    origin: StateDescriptor,
    fetch: FileFetcher,
  ): Promise<{ renamed: Map<string, { state: string; layer: string }>; build: BuildAt | null }> {
    const { format, parts } = manifest;
    if (format !== STATE_FORMAT) {
      throw new VmError('state_corrupt', `export format ${format}; this reads ${STATE_FORMAT}`);
    }
    for (const part of parts) checkPart(part);
    // Never restore onto another build: the state's own is here, or fetched before any part.
    const build = await this.placeBuild((origin.spec as MachineSpec).image, manifest.build, fetch);
    try {
      return { renamed: await this.putParts(parts, fetch), build };
    } catch (err) {
      if (build) this.store.unpinBuild(build.dir);
      throw err;
    }
  }

  /**
   * Puts in place the parts this node lacks; returns the templates taken in as fork points of
   * their own (see below), by their exported ids.
   */
  private async putParts(
    parts: readonly ExportedPart[],
    fetch: FileFetcher,
  ): Promise<Map<string, { state: string; layer: string }>> {
    // A template frozen here under the same key is another boot of it (another memory image):
    // the source's comes as a fork point and a disk layer of their own, named after its content
    // so that the next import from it finds them, and the records naming it are rewritten.
    const renamed = new Map<string, { state: string; layer: string }>();
    for (const part of parts) {
      if (part.kind !== 'state' || !part.id.startsWith('template-')) continue;
      if (!existsSync(this.templateDir(part.id, 'complete'))) continue;
      if (await this.sameFiles(part)) continue;
      const digest = createHash('sha256')
        .update(part.files.map((f) => f.sha256).join(','))
        .digest('hex')
        .slice(0, 16);
      renamed.set(part.id, { state: `fork-${digest}`, layer: `layer-${digest}` });
    }
    for (const part of parts) {
      const as = renamed.get(part.id);
      const key = as?.state ?? part.id;
      for (;;) {
        const busy = this.importing.get(key);
        if (!busy) break;
        await busy.catch(() => undefined);
      }
      if (as ? existsSync(join(this.store.imagesDir, `${as.state}.json`)) : this.present(part)) {
        continue;
      }
      const work = as
        ? this.importTemplateAs(part, as, fetch)
        : this.importPart(part, fetch, renamed);
      this.importing.set(key, work);
      try {
        await work;
      } finally {
        this.importing.delete(key);
      }
    }
    return renamed;
  }

  private templateDir(id: string, name: string): string {
    return join(this.store.templatesDir, id.slice('template-'.length), name);
  }

  /** Whether this node's files of `part` are the exported ones, byte for byte. */
  private async sameFiles(part: ExportedPart): Promise<boolean> {
    for (const f of part.files) {
      const mine = await this.describeFile(f.path, true).catch(() => null);
      if (!mine || mine.size !== f.size || mine.sha256 !== f.sha256) return false;
    }
    return true;
  }

  /** The source's frozen template, as fork point `as.state` over disk layer `as.layer`. */
  private async importTemplateAs(
    part: ExportedPart,
    as: { state: string; layer: string },
    fetch: FileFetcher,
  ): Promise<void> {
    const file = (name: string): ExportedFile | undefined =>
      part.files.find((f) => f.path.endsWith(`/${name}`));
    const mem = file('memory.img');
    const device = file('device.state');
    if (!mem || !device)
      throw new VmError('state_corrupt', `template part ${part.id} is incomplete`);
    const disk = file('disk.qcow2');
    if (disk) {
      const dest = join(this.store.disks.dir, `${as.layer}.qcow2`);
      await this.fetchFile(disk, `${dest}.part`, true, fetch);
      await rename(`${dest}.part`, dest);
      await writeRecord(join(this.store.disks.dir, `${as.layer}.json`), { backing: null });
    }
    const base = join(this.store.imagesDir, as.state);
    await this.fetchFile(mem, `${base}.mem.part`, true, fetch);
    await rename(`${base}.mem.part`, `${base}.mem`);
    await this.fetchFile(device, `${base}.state.part`, true, fetch);
    await rename(`${base}.state.part`, `${base}.state`);
    await writeRecord(`${base}.json`, { disk: disk ? as.layer : null });
  }

  /** Whether this node has `part` whole (the file that publishes it is there). */
  private present(part: ExportedPart): boolean {
    const d = this.store.dataDir;
    switch (part.kind) {
      case 'paused':
        return existsSync(join(this.store.pausedDir, part.id, 'device.state'));
      case 'layer':
        return existsSync(join(d, 'disks', `${part.id}.json`));
      case 'state':
        return part.id.startsWith('template-')
          ? existsSync(join(this.store.templatesDir, part.id.slice('template-'.length), 'complete'))
          : existsSync(join(this.store.imagesDir, `${part.id}.json`));
    }
  }

  private async importPart(
    part: ExportedPart,
    fetch: FileFetcher,
    renamed: ReadonlyMap<string, { state: string; layer: string }> = new Map(),
  ): Promise<void> {
    const d = this.store.dataDir;
    const folder = part.kind === 'paused' || part.id.startsWith('template-');
    if (folder) {
      // Fetched into a staging folder beside the real one, which appears whole by one rename.
      const dest = join(d, dirname(part.files[0]!.path));
      const staging = join(dirname(dest), `.in-${basename(dest)}`);
      await mkdir(staging, { recursive: true, mode: part.kind === 'paused' ? 0o700 : 0o750 });
      if (part.kind !== 'paused' && this.group !== undefined) {
        await chown(staging, 0, this.group);
        await chmod(staging, 0o710);
      }
      try {
        for (const file of part.files) {
          const to = join(staging, basename(file.path));
          await this.fetchFile(file, to, part.kind !== 'paused', fetch);
          if (to.endsWith('.json')) await rewriteRecord(to, renamed);
        }
        await rm(dest, { recursive: true, force: true });
        await rename(staging, dest);
      } catch (err) {
        await rm(staging, { recursive: true, force: true });
        throw err;
      }
      return;
    }
    // A layer or a fork point: its record (.json) last, which is what makes it openable.
    const ordered = [...part.files].sort(
      (a, b) => Number(a.path.endsWith('.json')) - Number(b.path.endsWith('.json')),
    );
    for (const file of ordered) {
      const dest = join(d, file.path);
      await this.fetchFile(file, `${dest}.part`, true, fetch);
      if (dest.endsWith('.json')) await rewriteRecord(`${dest}.part`, renamed);
      await rename(`${dest}.part`, dest);
    }
  }

  /** Fetches `file` into `to`, resuming what is there, and checks it; removed when wrong. */
  private async fetchFile(
    file: ExportedFile,
    to: string,
    shared: boolean,
    fetch: FileFetcher,
  ): Promise<void> {
    let lastErr: unknown = null;
    for (let attempt = 0; attempt < FETCH_TRIES; attempt++) {
      const have = await stat(to).then(
        (s) => (s.isFile() && s.size <= file.size ? s.size : -1),
        () => 0,
      );
      if (have < 0) await rm(to, { recursive: true, force: true });
      const offset = Math.max(0, have);
      try {
        if (file.size === 0) {
          await (await open(to, 'w', 0o600)).close();
        } else if (offset < file.size) {
          const body = await fetch(file, offset);
          let written = offset;
          const out = createWriteStream(to, {
            flags: offset > 0 ? 'r+' : 'w',
            start: offset,
            mode: 0o600,
          });
          await pipeline(
            body,
            async function* (source: AsyncIterable<Uint8Array>) {
              for await (const chunk of source) {
                written += chunk.length;
                if (written > file.size) {
                  throw new VmError('state_corrupt', `${file.path} is longer than exported`);
                }
                yield chunk;
              }
            },
            out,
          );
        }
        lastErr = null;
        break;
      } catch (err) {
        lastErr = err;
        if (err instanceof VmError) break;
      }
    }
    if (lastErr !== null) throw lastErr;
    const st = await stat(to);
    const sha256 = await hashFile(to);
    if (st.size !== file.size || sha256 !== file.sha256) {
      await rm(to, { force: true });
      throw new VmError(
        'state_corrupt',
        `${file.path} arrived with another checksum than exported`,
      );
    }
    await syncFile(to);
    if (shared) {
      if (this.group !== undefined) await chown(to, 0, this.group);
      // RAM images too: QEMUs map them copy-on-write (vm/storage/mem-image.ts, RAM_IMAGE_MODE).
      await chmod(to, 0o640);
    }
  }

  /** One file's export entry; files that never change once written keep their digest. */
  private async describeFile(path: string, immutable: boolean): Promise<ExportedFile> {
    const full = join(this.store.dataDir, path);
    const st = await stat(full);
    const key = `${st.ino}:${st.size}:${st.mtimeMs}`;
    const known = immutable ? digests.get(full) : undefined;
    if (known?.key === key) return { path, size: st.size, sha256: known.sha256 };
    const sha256 = await hashFile(full);
    if (immutable) digests.set(full, { key, sha256 });
    return { path, size: st.size, sha256 };
  }
}

/**
 * Refuses an exported build that is not the one the state names, or whose files are not a
 * build's, before anything is fetched.
 */
function checkBuild(build: ExportedBuild, image: GuestImage): void {
  const ok =
    typeof build.template === 'string' &&
    /^[a-z0-9-]{1,63}$/.test(build.template) &&
    build.key === image.key &&
    Array.isArray(build.files) &&
    build.files.every(
      (f) =>
        typeof f.path === 'string' &&
        f.path.startsWith('cache/') &&
        !f.path.includes('/../') &&
        Number.isSafeInteger(f.size) &&
        f.size >= 0 &&
        /^[0-9a-f]{64}$/.test(f.sha256) &&
        [...BUILD_FILES, 'manifest.json'].some((n) => n === fileName(f)),
    );
  if (!ok) {
    throw new VmError(
      'state_corrupt',
      `the export's template build is not build ${image.key} the state was made on`,
    );
  }
}

/**
 * `spec` with its image's files in build folder `dir` (where this node keeps that build), or
 * as it is when `dir` is not given.
 */
function onBuild(spec: MachineSpec, dir: string | undefined): MachineSpec {
  if (dir === undefined || dirname(spec.image.rootfs) === dir) return spec;
  const at = (p: string): string => join(dir, basename(p));
  const { image } = spec;
  return {
    ...spec,
    image: {
      ...image,
      kernel: at(image.kernel),
      initrd: at(image.initrd),
      rootfs: at(image.rootfs),
      ...(image.disk ? { disk: at(image.disk) } : {}),
    },
  };
}

/** Refuses a part whose files are not where a part of its kind and id keeps them. */
function checkPart(part: ExportedPart): void {
  const ok =
    part.files.length > 0 &&
    part.files.every((f) => {
      if (!isExportable(f.path) || !Number.isSafeInteger(f.size) || f.size < 0) return false;
      if (!/^[0-9a-f]{64}$/.test(f.sha256)) return false;
      switch (part.kind) {
        case 'paused':
          return f.path.startsWith(`paused/${part.id}/`);
        case 'layer':
          return f.path.startsWith(`disks/${part.id}.`);
        case 'state':
          return part.id.startsWith('template-')
            ? f.path.startsWith(`templates/${part.id.slice('template-'.length)}/`)
            : f.path.startsWith(`images/${part.id}.`);
      }
    });
  if (!ok) throw new VmError('state_corrupt', `export part ${part.id} names files it cannot have`);
}

/** A record (a layer's, a fork point's, a paused disk's) naming renamed templates by their new ids. */
async function rewriteRecord(
  path: string,
  renamed: ReadonlyMap<string, { state: string; layer: string }>,
): Promise<void> {
  if (renamed.size === 0) return;
  const record = JSON.parse(await readFile(path, 'utf8')) as Record<string, unknown>;
  let changed = false;
  for (const field of ['backing', 'disk']) {
    const as = typeof record[field] === 'string' ? renamed.get(record[field]) : undefined;
    if (as) {
      record[field] = as.layer;
      changed = true;
    }
  }
  if (changed) await writeRecord(path, record);
}

async function writeRecord(path: string, record: Record<string, unknown>): Promise<void> {
  await writeFile(`${path}.tmp`, JSON.stringify(record), { mode: 0o640 });
  await rename(`${path}.tmp`, path);
}

async function hashFile(path: string): Promise<string> {
  const h = createHash('sha256');
  await pipeline(createReadStream(path), h);
  return h.digest('hex');
}
