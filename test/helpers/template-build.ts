/**
 * A template build of `python` in an image cache, as the builder leaves one: its files and a
 * manifest with their sizes and sha256, and the spec of a machine of it. The state store's tests
 * (paused-transfer.test.ts, state-delta.test.ts) freeze and move states of it.
 */
import { createHash } from 'node:crypto';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { MachineSpec } from '../../src/vm/qemu/qemu-args.js';

/**
 * Build `key` in image cache `cache`. `seed` makes other bytes under the same key (a build of the
 * same recipe made elsewhere at another time); `disk` adds the build's empty writable disk.
 */
export async function templateBuild(
  cache: string,
  key: string,
  {
    seed = 'a',
    memoryMib = 64,
    disk = true,
  }: { seed?: string; memoryMib?: number; disk?: boolean } = {},
): Promise<MachineSpec> {
  const dir = join(cache, 'templates', 'python', key);
  await mkdir(dir, { recursive: true });
  const files: Record<string, { size_bytes: number; sha256: string }> = {};
  const sizes: [string, number][] = [
    ['vmlinux', 40_000],
    ['initrd.cpio', 20_000],
    ['rootfs.erofs', 300_000],
    ...(disk ? ([['disk.qcow2', 3_000]] as [string, number][]) : []),
  ];
  for (const [name, size] of sizes) {
    const body = Buffer.alloc(size, `${seed}${name}${key}`);
    await writeFile(join(dir, name), body);
    files[name] = { size_bytes: size, sha256: createHash('sha256').update(body).digest('hex') };
  }
  const manifest = { format: 2, name: 'python', key, built_at: `${seed}`, files };
  await writeFile(join(dir, 'manifest.json'), JSON.stringify(manifest));
  return {
    image: {
      kernel: join(dir, 'vmlinux'),
      initrd: join(dir, 'initrd.cpio'),
      rootfs: join(dir, 'rootfs.erofs'),
      cmdline: '',
      key,
      ...(disk ? { disk: join(dir, 'disk.qcow2') } : {}),
    },
    memoryMib,
    vcpus: 1,
    accel: 'tcg',
    tcgTbMib: 16,
  };
}
