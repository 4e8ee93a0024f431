/**
 * The guest image built by guest/image/build.sh: a kernel, an initrd holding the whole root
 * filesystem and the agent, and a manifest with the kernel command line.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { GuestImage } from './qemu-args.js';

interface Manifest {
  key: string;
  cmdline: string;
  kernel_version?: string;
  tcg?: { cmdline_append?: string; cpu?: string };
}

/** Reads `dir/manifest.json`; fails with a message that says how to build the image. */
export async function loadImage(dir: string): Promise<GuestImage & { kernelVersion: string }> {
  let manifest: Manifest;
  try {
    manifest = JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8')) as Manifest;
  } catch (err) {
    throw new Error(
      `no guest image in "${dir}" (${(err as Error).message}); build one with guest/image/build.sh`,
    );
  }
  return {
    kernel: join(dir, 'vmlinux'),
    initrd: join(dir, 'initrd.cpio'),
    cmdline: manifest.cmdline,
    key: manifest.key,
    kernelVersion: manifest.kernel_version ?? 'unknown',
    tcgCmdlineAppend: manifest.tcg?.cmdline_append,
    tcgCpu: manifest.tcg?.cpu,
  };
}
