/**
 * Builds a template directory (what src/vm/image/image.ts loads) from a normalized recipe, by running
 * the scripts of guest/image, into the cache:
 *
 *   <cache>/kernel/<key>/         fetch-kernel.sh: kernel, modules, busybox (downloaded once)
 *   <cache>/boot/<key>/           build-boot.sh: vmlinux + initrd (init, modules, the agent)
 *   <cache>/debian/<key>/         build-debian.sh: the installed Debian packages, as a tarball
 *   <cache>/debs/                 every .deb downloaded so far, read first by later builds
 *   <cache>/disk/<size>-<key>/    build-disk.sh: the empty ext4 disk.qcow2
 *   <cache>/rootfs/<name>-<key>/  build-rootfs.sh: the template's rootfs.erofs
 *   <cache>/templates/<name>/<key>/   hard links to all of the above + manifest.json
 *   <cache>/templates/<name>/build.log  the last build's log (kept when it failed)
 *
 * Each layer has its own key, so an agent change rebuilds only the initrd (a second), a change
 * to a recipe's files or setup commands reuses the installed packages, and a change to the
 * package list downloads only new .deb files. One build per template at a time, across
 * processes (a file lock); every artifact is built in a temporary directory and renamed into
 * place, so readers never see half of one.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import {
  chmod,
  copyFile,
  link,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  rename,
  rm,
  stat,
  writeFile,
} from 'node:fs/promises';
import { basename, dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { BuildLog, runScript, TemplateBuildError } from './build-step.js';
import { fsSyncer, syncTree, type Syncer } from '../storage/durable.js';
import { withFileLock } from '../storage/file-lock.js';
import { loadImage, MANIFEST_FORMAT, type LoadedImage, type TemplateManifest } from './image.js';
import { DISK_SERIAL, ROOTFS_SERIAL } from './image.js';

/** Resources of a template's VMs. */
export interface TemplateResources {
  readonly memoryMib: number;
  readonly vcpus: number;
  /** Restored VMs kept ready, so a create is a hand-over. */
  readonly poolSize: number;
  /** Size of each VM's writable disk. */
  readonly diskMib: number;
}

/** A file or directory of the host copied into the root filesystem. */
export interface TemplateFile {
  /** Absolute host path. */
  readonly src: string;
  /** Absolute guest path. */
  readonly dest: string;
  /** For a file; null: 0644. A directory's files keep 0755 or 0644 by their executable bit. */
  readonly mode: number | null;
}

/** A template as the builder needs it: a recipe after core/recipe.ts normalized it. */
export interface TemplateSpec {
  readonly name: string;
  readonly description: string;
  readonly vm: TemplateResources;
  /** Beyond guest/image/base-packages, which every template has. */
  readonly debianPackages: readonly string[];
  readonly files: readonly TemplateFile[];
  /** Shell commands run as root in the root filesystem, in order, after the packages. */
  readonly setup: readonly string[];
  readonly python: {
    readonly packages: readonly string[];
    /** Absolute directory of wheels for `pip install --find-links`. */
    readonly wheels: string | null;
    readonly indexUrl: string | null;
  };
  /** Modules the REPL imports before the template is frozen. */
  readonly preload: readonly string[];
  /**
   * Python the REPL runs after the preloads, before the template is frozen ('' for none): the
   * first use of what the preloads import (a figure rendered, a DataFrame grouped), done once
   * so that every sandbox inherits it. Not part of the root filesystem: a change re-freezes
   * the template without rebuilding its image.
   */
  readonly warmup: string;
  /** Default environment of the template's execs. */
  readonly env: Readonly<Record<string, string>>;
}

/** What guest/image/build-rootfs.sh reads (snake_case: a Python script reads it). */
interface RootfsBuildSpec {
  name: string;
  key: string;
  debian_dir: string;
  files: { src: string; dest: string; mode: number }[];
  setup: readonly string[];
  python: { packages: readonly string[]; wheels: string | null; index_url: string | null };
  template: { name: string; preload: readonly string[]; env: Readonly<Record<string, string>> };
  compression: string;
}

/**
 * EROFS compression of root filesystems: lz4 makes the image much smaller than none, guests
 * import as fast from it, and it packs several times faster than lz4hc, which saves little more
 * (docs/architecture.md, "Measured choices in the code").
 */
export const ROOTFS_COMPRESSION = 'lz4';
/** Bump when this file changes what goes into a root filesystem. */
const BUILDER_VERSION = 1;
/** The scripts whose content defines a root filesystem (their changes change its key). */
const ROOTFS_SCRIPTS = [
  'lib.sh',
  'base-packages',
  'build-debian.sh',
  'build-rootfs.sh',
  'rootfs.py',
];

export interface BuildOptions {
  readonly cacheDir: string;
  /** The checkout holding guest/ (default: the one this file is in). */
  readonly repoDir?: string;
  /** Environment of the scripts (mirrors: docs/templates.md); default process.env. */
  readonly env?: NodeJS.ProcessEnv;
  /** Every line of build output as it comes (the CLI prints them). */
  readonly onLine?: (line: string) => void;
  readonly signal?: AbortSignal;
}

export interface BuiltTemplate extends LoadedImage {
  /** False when the cache already held this exact build. */
  readonly built: boolean;
}

const REPO_DIR = fileURLToPath(new URL('../../../../', import.meta.url));

/** Where the last build of template `name` wrote its log (kept after a failure). */
export function buildLogPath(cacheDir: string, name: string): string {
  return join(resolve(cacheDir), 'templates', name, 'build.log');
}
const run = promisify(execFile);
const inflight = new Map<string, Promise<BuiltTemplate>>();

/**
 * Builds `spec` unless the cache holds it, and returns its directory, loaded. Calls for the
 * same template share one build. Throws TemplateBuildError naming the failed step; the other
 * templates are not affected. A build of the default template from nothing takes minutes (it
 * downloads and installs Debian packages); hostd starts it at start-up, `npm run template --
 * build` ahead of time.
 *
 * @example const { dir } = await buildTemplate(recipe, { cacheDir: loadTemplateSettings().cacheDir });
 */
export function buildTemplate(spec: TemplateSpec, opts: BuildOptions): Promise<BuiltTemplate> {
  const id = `${resolve(opts.cacheDir)}\0${JSON.stringify(spec)}`;
  let p = inflight.get(id);
  if (!p) {
    p = build(spec, opts).finally(() => inflight.delete(id));
    inflight.set(id, p);
  }
  return p;
}

async function build(spec: TemplateSpec, opts: BuildOptions): Promise<BuiltTemplate> {
  const repo = opts.repoDir ?? REPO_DIR;
  const image = join(repo, 'guest', 'image');
  const cache = resolve(opts.cacheDir);
  const env = { ...(opts.env ?? process.env), SERVICE_CACHE_DIR: cache };
  const rootfsKey = await rootfsKeyOf(spec, image);
  const templatesDir = join(cache, 'templates', spec.name);
  return withFileLock(`${templatesDir}.lock`, async () => {
    const log = await BuildLog.open(spec.name, buildLogPath(cache, spec.name), opts.onLine);
    try {
      const script = (step: string, name: string, args: readonly string[]): Promise<string> =>
        runScript(log, step, [join(image, name), ...args], env, opts.signal);
      const boot = await script('boot image', 'build-boot.sh', []);
      const disk = await script('writable disk', 'build-disk.sh', [String(spec.vm.diskMib)]);
      const key = templateKeyOf(spec, rootfsKey, boot, disk);
      const dir = join(templatesDir, key);
      if (await exists(join(dir, 'manifest.json'))) {
        log.note(`template ${spec.name} is built: ${dir}`);
        return { ...(await loadImage(dir)), built: false };
      }
      // The scripts publish their layers by a rename, unsynced (guest/image/lib.sh is in the
      // root filesystem's key: changing it rebuilds every template): made durable here, before
      // this build's own outputs name them.
      await durableLayer(boot);
      await durableLayer(disk);
      const rootfs = join(cache, 'rootfs', `${spec.name}-${rootfsKey}`);
      if (!(await exists(join(rootfs, 'rootfs.json')))) {
        const t0 = Date.now();
        const debian = await script('debian packages', 'build-debian.sh', spec.debianPackages);
        await durableLayer(debian);
        await publish(rootfs, async (tmp) => {
          const buildSpec = rootfsBuildSpec(spec, rootfsKey, debian);
          await writeFile(join(tmp, 'spec.json'), JSON.stringify(buildSpec, null, 2));
          await script('root filesystem', 'build-rootfs.sh', [join(tmp, 'spec.json'), tmp]);
          log.step = 'publish';
          const info = {
            ...(await fileInfo(join(tmp, 'rootfs.erofs'))),
            build_s: (Date.now() - t0) / 1000,
          };
          await writeFile(join(tmp, 'rootfs.json'), `${JSON.stringify(info, null, 2)}\n`);
        });
        log.note(`root filesystem of ${spec.name} built in ${(Date.now() - t0) / 1000} s`);
      }
      log.step = 'publish';
      await publish(dir, async (tmp) => {
        for (const [from, name] of [
          [boot, 'vmlinux'],
          [boot, 'initrd.cpio'],
          [rootfs, 'rootfs.erofs'],
          [disk, 'disk.qcow2'],
        ] as const) {
          await hardLink(join(from, name), join(tmp, name));
        }
        const manifest = await manifestOf(spec, key, rootfsKey, { image, boot, rootfs, disk });
        await writeFile(join(tmp, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
      });
      log.note(`template ${spec.name} is built: ${dir}`);
      return { ...(await loadImage(dir)), built: true };
    } catch (err) {
      if (err instanceof TemplateBuildError) throw err;
      log.note(`error: ${(err as Error).stack ?? String(err)}`);
      throw log.failure((err as Error).message);
    } finally {
      await log.close();
    }
  });
}

/** A template directory's key: its three cached parts and what the manifest adds to them. */
function templateKeyOf(
  spec: TemplateSpec,
  rootfsKey: string,
  bootDir: string,
  diskDir: string,
): string {
  const parts = { rootfsKey, boot: basename(bootDir), disk: basename(diskDir) };
  // Only a recipe with a warm-up adds it: the keys of the others stay what they were.
  const warmup = spec.warmup === '' ? {} : { warmup: spec.warmup };
  return digest({ ...parts, vm: spec.vm, description: spec.description, ...warmup }).slice(0, 16);
}

/**
 * The template's directory if the cache holds this exact build, else null; builds nothing
 * (for listings, and for callers that must not start a build of minutes).
 */
export async function findBuilt(
  spec: TemplateSpec,
  opts: BuildOptions,
): Promise<LoadedImage | null> {
  const image = join(opts.repoDir ?? REPO_DIR, 'guest', 'image');
  const cache = resolve(opts.cacheDir);
  const env = { ...(opts.env ?? process.env), SERVICE_CACHE_DIR: cache };
  const dirOf = async (args: string[]): Promise<string> => {
    const { stdout } = await run('bash', args, { env });
    return stdout.trim();
  };
  // At once: each start looks its templates up before it serves, and the scripts' keys take
  // most of that time waiting for bash.
  const [boot, disk, rootfsKey] = await Promise.all([
    dirOf([join(image, 'build-boot.sh'), '--dir']),
    dirOf([join(image, 'build-disk.sh'), '--dir', String(spec.vm.diskMib)]),
    rootfsKeyOf(spec, image),
  ]);
  const dir = join(cache, 'templates', spec.name, templateKeyOf(spec, rootfsKey, boot, disk));
  return (await exists(join(dir, 'manifest.json'))) ? loadImage(dir) : null;
}

function rootfsBuildSpec(spec: TemplateSpec, key: string, debianDir: string): RootfsBuildSpec {
  return {
    name: spec.name,
    key,
    debian_dir: debianDir,
    files: spec.files.map((f) => ({ src: f.src, dest: f.dest, mode: f.mode ?? 0o644 })),
    setup: spec.setup,
    python: {
      packages: spec.python.packages,
      wheels: spec.python.wheels,
      index_url: spec.python.indexUrl,
    },
    template: { name: spec.name, preload: spec.preload, env: spec.env },
    compression: ROOTFS_COMPRESSION,
  };
}

/**
 * The key of a template's root filesystem: its recipe (what reaches the image: not its VM
 * resources or description), the content of every file and wheel it names, and the scripts
 * that build it. 16 hex digits, like the scripts' keys.
 */
export async function rootfsKeyOf(
  spec: TemplateSpec,
  imageDir = join(REPO_DIR, 'guest', 'image'),
): Promise<string> {
  const scripts: Record<string, string> = {};
  for (const name of ROOTFS_SCRIPTS)
    scripts[name] = await hashPath(join(imageDir, name), spec.name, name);
  const files = [];
  for (const [i, f] of spec.files.entries()) {
    files.push({
      dest: f.dest,
      mode: f.mode,
      content: await hashPath(f.src, spec.name, `files[${i}].src`),
    });
  }
  const wheels =
    spec.python.wheels === null
      ? null
      : await hashPath(spec.python.wheels, spec.name, 'python.wheels');
  return digest({
    builder: BUILDER_VERSION,
    compression: ROOTFS_COMPRESSION,
    scripts,
    name: spec.name,
    debian: [...spec.debianPackages].sort(),
    files,
    setup: spec.setup,
    python: { packages: spec.python.packages, wheels, indexUrl: spec.python.indexUrl },
    preload: spec.preload,
    env: Object.entries(spec.env).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
  }).slice(0, 16);
}

function digest(value: unknown): string {
  return createHash('sha256').update(JSON.stringify(value)).digest('hex');
}

/**
 * sha256 of a file, or of a directory tree (every path, its executable bit and its content, in
 * sorted order). A missing input fails the build naming the recipe field.
 */
async function hashPath(path: string, template: string, field: string): Promise<string> {
  let st;
  try {
    st = await stat(path);
  } catch {
    throw new TemplateBuildError(
      template,
      'read the recipe',
      null,
      [],
      `${field}: ${path} does not exist`,
    );
  }
  if (!st.isDirectory()) return (await fileInfo(path)).sha256;
  const entries = (await readdir(path, { recursive: true, withFileTypes: true }))
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name))
    .sort();
  const parts = [];
  for (const file of entries) {
    const s = await stat(file);
    parts.push([relative(path, file), s.mode & 0o100 ? 'x' : '-', (await fileInfo(file)).sha256]);
  }
  return digest(parts);
}

async function fileInfo(path: string): Promise<{ size_bytes: number; sha256: string }> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return { size_bytes: (await stat(path)).size, sha256: hash.digest('hex') };
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

/**
 * Builds `dir` in a temporary sibling and renames it into place; the sibling goes on failure.
 * Callers hold the template's lock, so a sibling left by a builder that was killed is stale.
 * What it publishes is durable before the rename (every file and folder synced), and the rename
 * once it resolves (the parent synced): a power cut after a build never leaves a torn file under
 * a published name, which the next start would trust (its marker, `manifest.json` or
 * `rootfs.json`, is inside). Exported for its tests (`syncer`: a recording fake).
 */
export async function publish(
  dir: string,
  fill: (tmp: string) => Promise<void>,
  syncer: Syncer = fsSyncer,
): Promise<void> {
  const parent = resolve(dir, '..');
  await mkdir(parent, { recursive: true });
  for (const name of await readdir(parent)) {
    if (name.startsWith(`${basename(dir)}.tmp.`)) {
      await rm(join(parent, name), { recursive: true, force: true });
    }
  }
  const tmp = await mkdtemp(`${dir}.tmp.`);
  try {
    // QEMU runs as another account that must read the files (mkdtemp makes 0700).
    await chmod(tmp, 0o755);
    await fill(tmp);
    await syncTree(tmp, syncer);
    await rm(dir, { recursive: true, force: true }); // an unfinished older attempt
    await rename(tmp, dir);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
  await syncer.dir(parent);
}

/**
 * A layer a build script published (its folder renamed into place) made durable: its files and
 * folders synced, then the folder it was renamed in. Syncs of files already on disk cost little.
 */
async function durableLayer(dir: string, syncer: Syncer = fsSyncer): Promise<void> {
  await syncTree(dir, syncer);
  await syncer.dir(dirname(dir));
}

/** Shares the bytes with the cache entry it came from; a copy where links are not possible. */
async function hardLink(from: string, to: string): Promise<void> {
  try {
    await link(from, to);
  } catch {
    // Expected across file systems (EXDEV) or where links are refused: a copy does the same.
    await copyFile(from, to);
  }
}

interface Parts {
  /** guest/image */
  readonly image: string;
  readonly boot: string;
  readonly rootfs: string;
  readonly disk: string;
}

async function manifestOf(
  spec: TemplateSpec,
  key: string,
  rootfsKey: string,
  parts: Parts,
): Promise<TemplateManifest> {
  const json = async <T>(path: string): Promise<T> => JSON.parse(await readFile(path, 'utf8')) as T;
  const boot = await json<{
    key: string;
    kernel_version: string;
    kernel_package: string;
    cmdline: string;
    tcg: { cmdline_append: string; cpu: string };
    files: Record<string, { size_bytes: number; sha256: string }>;
  }>(join(parts.boot, 'boot.json'));
  const contents = await json<{
    debian_installed: string[];
    python_packages: { name: string; version: string }[];
  }>(join(parts.rootfs, 'contents.json'));
  const rootfs = await json<{ size_bytes: number; sha256: string; build_s: number }>(
    join(parts.rootfs, 'rootfs.json'),
  );
  const installed = new Map(
    contents.debian_installed.map((p) => p.split('=', 2) as [string, string]),
  );
  const base = (await readFile(join(parts.image, 'base-packages'), 'utf8'))
    .split('\n')
    .map((l) => l.replace(/#.*/, '').trim())
    .filter((l) => l !== '');
  const requested = [...new Set([...base, ...spec.debianPackages])].sort();
  return {
    format: MANIFEST_FORMAT,
    name: spec.name,
    key,
    description: spec.description,
    kernel: 'vmlinux',
    initrd: 'initrd.cpio',
    rootfs: 'rootfs.erofs',
    disk: 'disk.qcow2',
    cmdline: boot.cmdline,
    tcg: boot.tcg,
    devices: [
      {
        file: 'rootfs.erofs',
        format: 'raw',
        serial: ROOTFS_SERIAL,
        read_only: true,
        note: 'virtio-blk #1, the same file for every VM',
      },
      {
        file: 'disk.qcow2',
        format: 'qcow2',
        serial: DISK_SERIAL,
        read_only: false,
        note: 'virtio-blk #2, optional: each VM gets its own copy-on-write overlay of it; without it written files live in guest RAM',
      },
    ],
    resources: {
      memory_mib: spec.vm.memoryMib,
      vcpus: spec.vm.vcpus,
      pool_size: spec.vm.poolSize,
      disk_mib: spec.vm.diskMib,
    },
    env: spec.env,
    preload: spec.preload,
    warmup: spec.warmup,
    contents: {
      debian_packages: requested.map((name) => ({ name, version: installed.get(name) ?? '' })),
      debian_installed: contents.debian_installed,
      python_packages: contents.python_packages,
    },
    kernel_version: boot.kernel_version,
    kernel_package: boot.kernel_package,
    keys: { boot: boot.key, rootfs: rootfsKey },
    built_at: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
    rootfs_build_s: rootfs.build_s,
    files: {
      ...boot.files,
      'rootfs.erofs': { size_bytes: rootfs.size_bytes, sha256: rootfs.sha256 },
      'disk.qcow2': await fileInfo(join(parts.disk, 'disk.qcow2')),
    },
  };
}
