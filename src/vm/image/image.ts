/**
 * A built template directory (src/vm/image/image-builder.ts): the shared boot image (kernel and a
 * small initramfs with the agent), the template's read-only root filesystem, the empty disk
 * each VM gets a copy-on-write overlay of, and manifest.json describing them. hostd reads only
 * the manifest and passes the files to QEMU.
 */
import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';

export interface GuestImage {
  /** Uncompressed ELF kernel with a PVH note (microvm boots it directly). */
  readonly kernel: string;
  /** The boot image's initramfs: /init, busybox, kernel modules and the agent. */
  readonly initrd: string;
  /** The template's root filesystem (EROFS), attached read-only. */
  readonly rootfs: string;
  readonly cmdline: string;
  /** Identifies the image build; snapshots are only valid for the same key. */
  readonly key: string;
  /**
   * The template's empty ext4 disk (qcow2): the bottom of every VM's writable disk chain.
   * Without one, VMs keep written files in guest RAM.
   */
  readonly disk?: string;
  /** Appended to the command line under TCG; `{host_tsc_khz}` is filled in (manifest `tcg`). */
  readonly tcgCmdlineAppend?: string;
  /** CPU model under TCG (manifest `tcg.cpu`), e.g. with RDRAND so the guest RNG seeds at once. */
  readonly tcgCpu?: string;
}

/** Serial numbers by which the guest's /init finds its disks (guest/image/init). */
export const ROOTFS_SERIAL = 'hostd-root';
export const DISK_SERIAL = 'hostd-disk';

/** Version of the manifest layout; older directories (one initrd holding everything) are not read. */
export const MANIFEST_FORMAT = 2;

/** A package and the version that was installed. */
export interface PackageVersion {
  readonly name: string;
  readonly version: string;
}

/** `manifest.json` of a template directory, as written by the builder (snake_case on disk). */
export interface TemplateManifest {
  readonly format: typeof MANIFEST_FORMAT;
  readonly name: string;
  /** Identifies the whole build (boot image, root filesystem, resources): snapshots taken with one key restore only with it. */
  readonly key: string;
  readonly description: string;
  /** File names in the directory. */
  readonly kernel: string;
  readonly initrd: string;
  readonly rootfs: string;
  readonly disk: string;
  readonly cmdline: string;
  readonly tcg: { readonly cmdline_append: string; readonly cpu: string };
  /** How QEMU must attach the disks, in this order; /init finds them by serial number. */
  readonly devices: readonly {
    readonly file: string;
    readonly format: 'raw' | 'qcow2';
    readonly serial: string;
    readonly read_only: boolean;
    readonly note: string;
  }[];
  readonly resources: {
    readonly memory_mib: number;
    readonly vcpus: number;
    readonly pool_size: number;
    readonly disk_mib: number;
  };
  readonly env: Readonly<Record<string, string>>;
  readonly preload: readonly string[];
  /** Python run before the template is frozen (recipe `warmup`); absent in older builds. */
  readonly warmup?: string;
  readonly contents: {
    /** The recipe's Debian packages and every template's base ones, with installed versions. */
    readonly debian_packages: readonly PackageVersion[];
    /** Every installed Debian package, `name=version`. */
    readonly debian_installed: readonly string[];
    /** What pip installed from the recipe's python.packages, with dependencies. */
    readonly python_packages: readonly PackageVersion[];
  };
  readonly kernel_version: string;
  readonly kernel_package: string;
  readonly keys: { readonly boot: string; readonly rootfs: string };
  readonly built_at: string;
  /** Wall time of the root filesystem build (Debian packages, recipe steps, images). */
  readonly rootfs_build_s: number;
  readonly files: Readonly<
    Record<string, { readonly size_bytes: number; readonly sha256: string }>
  >;
}

/** A template directory ready for QEMU: paths resolved, plus what the catalog shows. */
export interface LoadedImage extends GuestImage {
  readonly dir: string;
  readonly kernelVersion: string;
  /** The template's empty ext4 disk (qcow2): give each VM a copy-on-write overlay of it. */
  readonly disk: string;
  readonly manifest: TemplateManifest;
}

/**
 * Reads `dir/manifest.json` (a template directory from the builder, e.g. what
 * `npm run template -- path python` prints); fails with a message that says how to build one.
 */
export async function loadImage(dir: string): Promise<LoadedImage> {
  let manifest: TemplateManifest;
  try {
    manifest = JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8')) as TemplateManifest;
  } catch (err) {
    throw new Error(
      `no template image in "${dir}" (${(err as Error).message}); build one with \`npm run template -- build NAME\``,
    );
  }
  if (manifest.format !== MANIFEST_FORMAT) {
    throw new Error(
      `"${dir}" holds an image of an older layout (format ${String(manifest.format)}, want ${MANIFEST_FORMAT}); build a new one with \`npm run template -- build NAME\``,
    );
  }
  return {
    dir,
    kernel: join(dir, manifest.kernel),
    initrd: join(dir, manifest.initrd),
    rootfs: join(dir, manifest.rootfs),
    disk: join(dir, manifest.disk),
    cmdline: manifest.cmdline,
    key: manifest.key,
    kernelVersion: manifest.kernel_version,
    tcgCmdlineAppend: manifest.tcg.cmdline_append,
    tcgCpu: manifest.tcg.cpu,
    manifest,
  };
}

/**
 * What a machine spec keeps of a template directory: the files QEMU opens and the key. Specs are
 * hashed into frozen templates' keys and stored with every snapshot, so they stay small and
 * hold nothing that changes without the image changing.
 */
export function guestImageOf(image: LoadedImage): GuestImage {
  return {
    kernel: image.kernel,
    initrd: image.initrd,
    rootfs: image.rootfs,
    // The empty writable disk each VM gets an overlay of (vm/storage/disk-store.ts).
    disk: image.disk,
    cmdline: image.cmdline,
    key: image.key,
    ...(image.tcgCmdlineAppend === undefined ? {} : { tcgCmdlineAppend: image.tcgCmdlineAppend }),
    ...(image.tcgCpu === undefined ? {} : { tcgCpu: image.tcgCpu }),
  };
}

/**
 * A saved machine state (snapshot, paused sandbox, frozen template) whose template build is no
 * longer where it was made: restoring its memory over another build's root filesystem would
 * corrupt the guest, so it is refused.
 */
export class ImageGoneError extends Error {
  constructor(
    /** The build the state was made on. */
    readonly key: string,
    /** The template directory it was in. */
    readonly dir: string,
    /** The key found there instead, or null when there is no build at all. */
    readonly found: string | null,
  ) {
    super(
      `it was made on template build ${key}, which is gone from ${dir}` +
        (found === null ? '' : ` (that directory now holds build ${found})`) +
        '; a saved state restores only on the build it was made on',
    );
    this.name = 'ImageGoneError';
  }
}

/** Throws ImageGoneError unless the template build `image` names is still in its directory. */
export async function checkImageBuild(image: GuestImage): Promise<void> {
  const dir = dirname(image.rootfs);
  let found: string | null = null;
  try {
    const manifest = JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8')) as {
      key?: unknown;
    };
    found = typeof manifest.key === 'string' ? manifest.key : null;
  } catch {
    // no manifest: the build is gone
  }
  if (found !== image.key) throw new ImageGoneError(image.key, dir, found);
}
