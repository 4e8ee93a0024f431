/**
 * Template builds are durable before they are published (vm/image/image-builder.ts `publish`,
 * vm/image/build-copies.ts for a build fetched from a peer): every file and folder of the build
 * synced before the rename that gives it its name, and the folder it is renamed in synced after,
 * so that a power cut never leaves a torn file under a name the next start trusts.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join, relative } from 'node:path';
import { after, describe, test } from 'node:test';
import { BuildCopies } from '../../src/vm/image/build-copies.js';
import { publish } from '../../src/vm/image/image-builder.js';
import type { ExportedFile } from '../../src/vm/machine.js';
import type { Syncer } from '../../src/vm/storage/durable.js';
import { peerBuild } from '../helpers/peer-build.js';

/** Records each sync, and whether the published folder had its name yet at that moment. */
class RecordingSyncer implements Syncer {
  readonly calls: { kind: 'file' | 'dir'; path: string; published: boolean }[] = [];

  constructor(private readonly published: () => string) {}

  async file(path: string): Promise<void> {
    this.calls.push({ kind: 'file', path, published: existsSync(this.published()) });
  }

  async dir(path: string): Promise<void> {
    this.calls.push({ kind: 'dir', path, published: existsSync(this.published()) });
  }
}

const roots: string[] = [];
after(async () => {
  for (const r of roots) await rm(r, { recursive: true, force: true });
});
const scratch = async (): Promise<string> => {
  const root = await mkdtemp(join(tmpdir(), 'build-durable-'));
  roots.push(root);
  return root;
};

/** Files synced before the folder had its name, relative to their folder's, sorted. */
const syncedBefore = (s: RecordingSyncer, kind: 'file' | 'dir'): string[] =>
  s.calls
    .filter((c) => c.kind === kind && !c.published)
    .map((c) => (kind === 'file' ? basename(c.path) : c.path))
    .sort();

describe('a template build', () => {
  test('is synced whole (files, folders) before its rename, and its parent after', async () => {
    const root = await scratch();
    const dir = join(root, 'templates', 'python', 'aaaaaaaaaaaaaaaa');
    let tmp = '';
    const syncer = new RecordingSyncer(() => dir);
    await publish(
      dir,
      async (t) => {
        tmp = t;
        await writeFile(join(t, 'rootfs.erofs'), 'x'.repeat(1000));
        await mkdir(join(t, 'modules'));
        await writeFile(join(t, 'modules', 'virtio.ko'), 'y');
        await writeFile(join(t, 'manifest.json'), '{}\n');
      },
      syncer,
    );
    assert.deepEqual(syncedBefore(syncer, 'file'), ['manifest.json', 'rootfs.erofs', 'virtio.ko']);
    assert.deepEqual(
      syncedBefore(syncer, 'dir').map((d) => relative(tmp, d)),
      ['', 'modules'],
    );
    // The rename is durable last: the folder it was made in, once the build has its name.
    assert.deepEqual(syncer.calls.at(-1), { kind: 'dir', path: dirname(dir), published: true });
    assert.equal(syncer.calls.filter((c) => c.published).length, 1);
  });

  test('fetched from a peer is synced whole before its rename, and its parent after', async () => {
    const root = await scratch();
    const cache = join(root, 'cache');
    await mkdir(cache);
    const { contents, build } = peerBuild('aaaaaaaaaaaaaaaa');
    let copyDir = join(root, 'not yet');
    const syncer = new RecordingSyncer(() => copyDir);
    const copies = new BuildCopies(cache, join(root, 'data'), async () => 1 << 30, syncer);
    const fetchInto = async (file: ExportedFile, to: string): Promise<void> => {
      // The folder the copy will be published as: its staging folder's sibling, `.in-` aside.
      copyDir = join(dirname(dirname(to)), basename(dirname(to)).replace(/^\.in-/, ''));
      await writeFile(to, contents[basename(file.path)]!);
    };
    const dir = await copies.obtain(build, fetchInto);
    assert.equal(copyDir, dir);
    assert.deepEqual(syncedBefore(syncer, 'file'), Object.keys(contents).sort());
    assert.ok(syncer.calls.some((c) => c.kind === 'dir' && !c.published));
    assert.deepEqual(syncer.calls.at(-1), { kind: 'dir', path: dirname(dir), published: true });
  });
});
