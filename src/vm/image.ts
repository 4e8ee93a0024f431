/**
 * A built template directory (src/vm/image-builder.ts): the shared boot image (kernel and a
 * small initramfs with the agent), the template's read-only root filesystem, the empty disk
 * each VM gets a copy-on-write overlay of, and manifest.json describing them. hostd reads only
 * the manifest and passes the files to QEMU.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { GuestImage } from './qemu-args.js';

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
