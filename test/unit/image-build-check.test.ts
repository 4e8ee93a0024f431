/**
 * Saved machine states belong to one template build (vm/image/image.ts, vm/qemu/state-store.ts): a frozen
 * template is keyed by its build, and a state whose build is gone is refused, never restored on
 * another build's root filesystem.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkImageBuild, ImageGoneError } from '../../src/vm/image/image.js';
import type { GuestImage, MachineSpec } from '../../src/vm/qemu/qemu-args.js';
import { templateKey } from '../../src/vm/qemu/state-store.js';

const dir = await mkdtemp(join(tmpdir(), 'hostd-image-check-'));
after(() => rm(dir, { recursive: true, force: true }));

const image = (key: string): GuestImage => ({
  kernel: join(dir, 'vmlinux'),
  initrd: join(dir, 'initrd.cpio'),
  rootfs: join(dir, 'rootfs.erofs'),
  cmdline: 'console=hvc0',
  key,
});
const spec = (key: string): MachineSpec => ({
  image: image(key),
  memoryMib: 512,
  vcpus: 1,
  accel: 'tcg',
  tcgTbMib: 32,
});

test('a frozen template is keyed by its build: a rebuilt template never reuses an old one', () => {
  assert.notEqual(templateKey(spec('aaaa'), 'qemu'), templateKey(spec('bbbb'), 'qemu'));
  assert.equal(templateKey(spec('aaaa'), 'qemu'), templateKey(spec('aaaa'), 'qemu'));
});

test('a state restores only while the build it was made on is where it was', async () => {
  await assert.rejects(
    checkImageBuild(image('aaaa')),
    (err: unknown) => err instanceof ImageGoneError && err.key === 'aaaa' && err.found === null,
  );
  await writeFile(join(dir, 'manifest.json'), JSON.stringify({ key: 'aaaa' }));
  await checkImageBuild(image('aaaa'));
  await assert.rejects(
    checkImageBuild(image('bbbb')),
    (err: unknown) => err instanceof ImageGoneError && err.key === 'bbbb' && err.found === 'aaaa',
  );
});
