/**
 * RAM images made by a hostd that kept them writable to QEMU's group (0660) are closed at the
 * next start (vm/storage/mem-image.ts, closeRamImages): a template's memory.img and fork
 * points' .mem lose their write bits; every other file keeps its mode.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmod, mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { closeRamImages } from '../../src/vm/storage/mem-image.js';

test('older RAM images lose their group write bit at start; other files keep their mode', async () => {
  const root = await mkdtemp(join(tmpdir(), 'hostd-close-ram-'));
  try {
    const templates = join(root, 'templates');
    const images = join(root, 'images');
    await mkdir(join(templates, 'k1'), { recursive: true });
    await mkdir(images);
    const files: Record<string, number> = {
      [join(templates, 'k1', 'memory.img')]: 0o660,
      [join(templates, 'k1', 'device.state')]: 0o660,
      [join(images, 'fork-0123456789abcdef.mem')]: 0o660,
      [join(images, 'spare-0123456789abcdef.mem')]: 0o640,
      [join(images, 'fork-0123456789abcdef.state')]: 0o660,
    };
    for (const [path, mode] of Object.entries(files)) {
      await writeFile(path, 'x');
      await chmod(path, mode);
    }
    assert.equal(await closeRamImages(templates, images), 2);
    const modes = async (): Promise<number[]> =>
      Promise.all(Object.keys(files).map(async (p) => (await stat(p)).mode & 0o777));
    assert.deepEqual(await modes(), [0o640, 0o660, 0o640, 0o640, 0o660]);
    assert.equal(await closeRamImages(templates, images), 0, 'a second start has nothing to do');
    assert.equal(await closeRamImages(join(root, 'none'), join(root, 'none')), 0);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});
