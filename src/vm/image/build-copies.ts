/**
 * Template builds copied from other nodes (cluster mode, a hand-over: docs/cluster.md). A paused
 * sandbox or a snapshot restores only onto the build it was made on (its memory holds the page
 * cache of that build's root filesystem), so a node taking one over whose own build of the
 * template differs, or that has none, fetches the source's build and keeps it here, in its
 * image cache beside the builder's:
 *
 *   <cache>/copies/<holder>/<template>/<key>-<digest>/   vmlinux, initrd.cpio, rootfs.erofs,
 *                                                          disk.qcow2, manifest.json
 *   <cache>/copies/<holder>/data-dir                      the data directory they serve
 *
 * A copy is named by the build's key and the digest of its files (`buildDigest`): the same key
 * built on two hosts at different times may hold other package versions, and two such builds
 * are never mixed. The builder never looks here, so the node's own creates keep using its own
 * build. Each data directory (`holder`, a hash of its path) has an area of its own, since
 * several hostds on one host may share a cache and each collects its copies once no state of
 * its own uses them, at once or at its next start: a copy shared between processes could not
 * be collected safely.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import {
  chmod,
  link,
  mkdir,
  readdir,
  readFile,
  rename,
  rm,
  stat,
  statfs,
  writeFile,
} from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import type { ExportedBuild, ExportedFile } from '../machine.js';
import { fsSyncer, syncTree, type Syncer } from '../storage/durable.js';
import { VmError } from '../vm-error.js';

/** The files of a build a machine reads (image.ts, GuestImage): all but the manifest. */
export const BUILD_FILES = ['vmlinux', 'initrd.cpio', 'rootfs.erofs', 'disk.qcow2'] as const;

const TEMPLATE = '[a-z0-9-]{1,63}';
const KEY = '[0-9a-f]{8,64}';
const BUILD_KEY = new RegExp(`^${KEY}$`);
const FILE = `(${[...BUILD_FILES, 'manifest.json'].map((f) => f.replace('.', '\\.')).join('|')})`;

/** The build files an export may name, relative to the image cache; nothing else is served. */
export const EXPORTABLE_BUILD_FILES = [
  new RegExp(`^templates/${TEMPLATE}/${KEY}/${FILE}$`),
  new RegExp(`^copies/[0-9a-f]{16}/${TEMPLATE}/${KEY}-[0-9a-f]{16}/${FILE}$`),
];

/**
 * What identifies a build's content: the sha256 of its files (the manifest aside, which says
 * when it was built), 16 hex digits.
 */
export function buildDigest(files: readonly { name: string; sha256: string }[]): string {
  const pairs = files
    .filter((f) => f.name !== 'manifest.json')
    .map((f) => [f.name, f.sha256])
    .sort(([a], [b]) => (a! < b! ? -1 : a! > b! ? 1 : 0));
  return createHash('sha256').update(JSON.stringify(pairs)).digest('hex').slice(0, 16);
}

/** The name of an exported build file (its last path element). */
export function fileName(file: ExportedFile): string {
  return file.path.slice(file.path.lastIndexOf('/') + 1);
}

/** `manifest.json` as far as a copy is checked against it. */
export interface BuildManifest {
  readonly name?: unknown;
  readonly key?: unknown;
  readonly files?: Record<string, { size_bytes?: unknown; sha256?: unknown }>;
}

/**
 * Build folder `dir`'s `manifest.json` (the builder hashed every file it lists), or null when
 * there is none or it does not parse: no build there (gone, or not the builder's).
 */
export async function readBuildManifest(dir: string): Promise<BuildManifest | null> {
  try {
    return JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8')) as BuildManifest;
  } catch {
    return null; // Expected: no such build here.
  }
}

/** Where a copy's folder `dir` is fetched into, or put aside to be removed. */
function asideOf(dir: string): string {
  return join(dir, '..', `.in-${dir.slice(dir.lastIndexOf('/') + 1)}`);
}

export class BuildCopies {
  /** This data directory's copies. */
  readonly area: string;
  private readonly root: string;
  /** Copies an import is bringing a state onto now, by folder: never collected meanwhile. */
  private readonly pins = new Map<string, number>();
  /** One operation per copy at a time (an install, a removal), by folder. */
  private readonly busy = new Map<string, Promise<unknown>>();
  /** Set by the first `collect` (a start's, once every record reopened its states). */
  private armed = false;

  constructor(
    readonly cacheDir: string,
    private readonly dataDir: string,
    /** Bytes free to an unprivileged writer on the file system of `dir` (tests give their own). */
    private readonly freeBytes: (dir: string) => Promise<number> = bytesFree,
    /** Makes a copy durable before it is published (tests give a recording fake). */
    private readonly syncer: Syncer = fsSyncer,
  ) {
    this.root = join(cacheDir, 'copies');
    const holder = createHash('sha256').update(resolve(dataDir)).digest('hex').slice(0, 16);
    this.area = join(this.root, holder);
  }

  /** Whether `dir` is a copy of this data directory's (not a build of the node's own). */
  isCopy(dir: string): boolean {
    return dir.startsWith(`${this.area}/`);
  }

  /** An exported build file's path in this cache, or null when it names none it may serve. */
  exportedPath(path: string): string | null {
    if (!path.startsWith('cache/')) return null;
    const rel = path.slice('cache/'.length);
    return EXPORTABLE_BUILD_FILES.some((re) => re.test(rel)) ? join(this.cacheDir, rel) : null;
  }

  /** How a file of the build folder `dir` is named in an export, or null when it is not served. */
  exportName(dir: string, name: string): string | null {
    const rel = relative(this.cacheDir, join(dir, name));
    if (rel.startsWith('..') || rel.startsWith('/')) return null;
    return this.exportedPath(`cache/${rel}`) ? `cache/${rel}` : null;
  }

  /**
   * The folder holding `build` on this node, pinned until `unpin`: the node's own build when
   * its files are the exported ones, else a copy, made now through `fetchInto` (each file
   * fetched to the path given, checked against its size and sha256) unless one is here already.
   * Rejects with `state_corrupt` when the files fetched are not the build the export says.
   */
  async obtain(
    build: ExportedBuild,
    fetchInto: (file: ExportedFile, to: string) => Promise<void>,
  ): Promise<string> {
    const names = build.files.map(fileName);
    const data = build.files.filter((f) => fileName(f) !== 'manifest.json');
    if (!names.includes('manifest.json') || !names.includes('rootfs.erofs')) {
      throw new VmError('state_corrupt', `the export of build ${build.key} lacks its files`);
    }
    if (new Set(names).size !== names.length) {
      throw new VmError('state_corrupt', `the export of build ${build.key} names a file twice`);
    }
    const own = join(this.cacheDir, 'templates', build.template, build.key);
    if (await sameBuild(own, build.template, build.key, data)) return this.pin(own);
    const digest = buildDigest(data.map((f) => ({ name: fileName(f), sha256: f.sha256 })));
    const dir = join(this.area, build.template, `${build.key}-${digest}`);
    this.pin(dir);
    try {
      await this.serial(dir, async () => {
        if (existsSync(join(dir, 'manifest.json'))) return;
        await this.install(dir, build, fetchInto);
      });
    } catch (err) {
      this.unpin(dir);
      throw err;
    }
    return dir;
  }

  /** Ends an `obtain`'s pin; a copy nothing uses then goes (`inUse` says what states use). */
  unpin(dir: string, inUse?: (dir: string) => boolean): void {
    const n = (this.pins.get(dir) ?? 1) - 1;
    if (n > 0) this.pins.set(dir, n);
    else this.pins.delete(dir);
    if (inUse) this.released(dir, inUse);
  }

  /**
   * A state on build folder `dir` is gone: the copy goes too when no state uses it any more and
   * no import is bringing one onto it. Before the first `collect` nothing goes (a start is still
   * reopening what its records name). Failures are left for the next collection.
   */
  released(dir: string, inUse: (dir: string) => boolean): void {
    if (!this.armed || !this.isCopy(dir)) return;
    void this.serial(dir, async () => {
      if (this.pins.has(dir) || inUse(dir)) return;
      await removeCopy(dir);
    }).catch(() => undefined);
  }

  /**
   * Removes this data directory's copies that no state uses (`inUse`) and what unfinished
   * installs left, and the areas of data directories that are gone; from now on a copy goes as
   * soon as nothing uses it. Returns how many copies were removed.
   */
  async collect(inUse: (dir: string) => boolean): Promise<number> {
    this.armed = true;
    let removed = 0;
    const templates = await readdir(this.area, { withFileTypes: true }).catch(() => []);
    for (const template of templates) {
      if (!template.isDirectory()) continue;
      const tdir = join(this.area, template.name);
      for (const name of await readdir(tdir)) {
        const dir = join(tdir, name);
        const staging = name.startsWith('.in-');
        const target = staging ? join(tdir, name.slice('.in-'.length)) : dir;
        if (this.pins.has(target) || this.busy.has(target)) continue;
        if (!staging && inUse(dir)) continue;
        await rm(dir, { recursive: true, force: true });
        if (!staging) removed++;
      }
    }
    // The areas of data directories removed since (their hostd gone for good).
    for (const holder of await readdir(this.root).catch(() => [] as string[])) {
      const area = join(this.root, holder);
      if (area === this.area) continue;
      const owner = await readFile(join(area, 'data-dir'), 'utf8').catch(() => null);
      if (owner !== null && !existsSync(owner.trim())) {
        await rm(area, { recursive: true, force: true });
      }
    }
    return removed;
  }

  /**
   * A file of one of the node's own builds of `template` with `file`'s name, size and sha256
   * (as the builder's manifest records them), or null.
   */
  private async ownFile(template: string, file: ExportedFile): Promise<string | null> {
    const name = fileName(file);
    if (name === 'manifest.json') return null;
    const builds = join(this.cacheDir, 'templates', template);
    for (const key of await readdir(builds).catch(() => [] as string[])) {
      if (!BUILD_KEY.test(key)) continue;
      const manifest = await readBuildManifest(join(builds, key));
      const mine = manifest?.files?.[name];
      if (mine?.sha256 === file.sha256 && mine.size_bytes === file.size) {
        return join(builds, key, name);
      }
    }
    return null;
  }

  /**
   * Refuses (`no_space`, before anything is fetched) a copy of `build` the image cache's file
   * system has no room for: the bytes of the files it would fetch, less what an earlier,
   * broken fetch left in `staging`. A file one of the node's own builds has is linked, and
   * takes no room.
   */
  private async ensureRoom(staging: string, build: ExportedBuild): Promise<void> {
    let need = 0;
    for (const file of build.files) {
      if ((await this.ownFile(build.template, file)) !== null) continue;
      const had = await stat(join(staging, fileName(file))).catch(() => null);
      need += Math.max(0, file.size - (had?.isFile() ? had.size : 0));
    }
    if (need === 0) return;
    const free = await this.freeBytes(this.cacheDir);
    if (need > free) {
      const mib = (n: number): number => Math.ceil(n / (1024 * 1024));
      throw new VmError(
        'no_space',
        `build ${build.key} of template ${build.template} needs ${mib(need)} MiB in the image cache, ${mib(free)} MiB free`,
      );
    }
  }

  private pin(dir: string): string {
    this.pins.set(dir, (this.pins.get(dir) ?? 0) + 1);
    return dir;
  }

  private serial<T>(dir: string, fn: () => Promise<T>): Promise<T> {
    const before = this.busy.get(dir) ?? Promise.resolve();
    const run = before.catch(() => undefined).then(fn);
    const settled = run.catch(() => undefined);
    this.busy.set(dir, settled);
    void settled.then(() => {
      if (this.busy.get(dir) === settled) this.busy.delete(dir);
    });
    return run;
  }

  /**
   * Fetches the build into a staging folder beside `dir` and renames it into place once every
   * file is checked and the manifest says it is this build. A fetch that broke off leaves the
   * staging folder for the next try to resume from (collected at the next start otherwise).
   */
  private async install(
    dir: string,
    build: ExportedBuild,
    fetchInto: (file: ExportedFile, to: string) => Promise<void>,
  ): Promise<void> {
    const staging = asideOf(dir);
    await this.ensureRoom(staging, build);
    await mkdir(this.area, { recursive: true, mode: 0o755 });
    // Which data directory the area serves: its copies go with it (`collect`).
    await writeFile(join(this.area, 'data-dir'), `${resolve(this.dataDir)}\n`);
    await mkdir(staging, { recursive: true, mode: 0o755 });
    // Read by QEMU's account like the builder's own builds (not secret: the same for every VM).
    await chmod(staging, 0o755);
    for (const file of build.files) {
      const to = join(staging, fileName(file));
      // A file one of the node's own builds has (a build whose key differs by its resources or
      // description only) is linked, not fetched: hundreds of MB for a root filesystem.
      const local = await this.ownFile(build.template, file);
      if (local === null || !(await linked(local, to))) await fetchInto(file, to);
      await chmod(to, 0o644);
    }
    const data = build.files.filter((f) => fileName(f) !== 'manifest.json');
    if (!(await sameBuild(staging, build.template, build.key, data))) {
      await rm(staging, { recursive: true, force: true });
      throw new VmError(
        'state_corrupt',
        `build ${build.key} of template ${build.template} arrived with a manifest of another build`,
      );
    }
    // Durable before it is published: a power cut must not leave a torn file in a folder that
    // a restart finds under its name and trusts (its restores use it unchecked).
    await syncTree(staging, this.syncer);
    await rm(dir, { recursive: true, force: true });
    await rename(staging, dir);
    await this.syncer.dir(dirname(dir));
  }
}

/**
 * Bytes free to an unprivileged writer on the file system of `dir`: of its nearest folder that
 * exists (a cache the first copy makes is not there yet).
 */
async function bytesFree(dir: string): Promise<number> {
  for (let at = resolve(dir); ; at = dirname(at)) {
    const fs = await statfs(at).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT' && at !== '/') return null;
      throw err;
    });
    if (fs) return fs.bavail * fs.bsize;
  }
}

/** Links `from` to `to` (replacing what is there); false where links are refused. */
async function linked(from: string, to: string): Promise<boolean> {
  await rm(to, { force: true });
  try {
    await link(from, to);
    return true;
  } catch {
    return false; // Expected across file systems (EXDEV): fetched instead.
  }
}

/**
 * Whether folder `dir` holds build `key` of `template` with exactly the files `data` (their
 * sizes and sha256 as its manifest records them: the builder hashes every file it publishes).
 */
async function sameBuild(
  dir: string,
  template: string,
  key: string,
  data: readonly ExportedFile[],
): Promise<boolean> {
  const manifest = await readBuildManifest(dir);
  if (manifest === null) return false;
  if (manifest.key !== key || manifest.name !== template) return false;
  const files = manifest.files ?? {};
  return data.every((f) => {
    const mine = files[fileName(f)];
    return mine?.sha256 === f.sha256 && mine.size_bytes === f.size;
  });
}

/** Removes a copy: renamed aside first, so that no reader ever finds half of one. */
async function removeCopy(dir: string): Promise<void> {
  const aside = asideOf(dir);
  await rm(aside, { recursive: true, force: true });
  await rename(dir, aside).catch(() => undefined);
  await rm(aside, { recursive: true, force: true });
}
