/**
 * Room for a template build copied from another node (vm/image/build-copies.ts): the image
 * cache's file system is asked before anything is fetched, for the files that would be fetched
 * (a file one of the node's own builds has is linked, not fetched). The copies themselves are in
 * test/unit/paused-transfer.test.ts.
 */
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { BuildCopies } from '../../src/vm/image/build-copies.js';
import { VmError, type ExportedFile } from '../../src/vm/machine.js';
import { manifestOf, peerBuild } from '../helpers/peer-build.js';

const KEY = 'aaaaaaaaaaaaaaaa';
const OWN_KEY = 'bbbbbbbbbbbbbbbb';
/** The source's build of python: a 1000-byte root filesystem and small other files. */
const { contents, build } = peerBuild(KEY);

describe('room for a build copied from another node', () => {
  const dirs: string[] = [];
  after(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  /** A cache and data directory of their own, `free` bytes free; the fetches it asks. */
  const setUp = async (free: number) => {
    const root = await mkdtemp(join(tmpdir(), 'build-room-'));
    dirs.push(root);
    const cache = join(root, 'cache');
    await mkdir(cache);
    const asked: string[] = [];
    const copies = new BuildCopies(cache, join(root, 'data'), async () => free);
    const fetchInto = async (file: ExportedFile, to: string): Promise<void> => {
      const name = file.path.slice(file.path.lastIndexOf('/') + 1);
      asked.push(name);
      await writeFile(to, contents[name]!);
    };
    return { cache, copies, asked, fetchInto };
  };

  test('a build the disk has no room for is refused (no_space) before any file is fetched', async () => {
    const { cache, copies, asked, fetchInto } = await setUp(1000);
    await assert.rejects(copies.obtain(build, fetchInto), (err: unknown) => {
      assert.ok(err instanceof VmError);
      assert.equal(err.kind, 'no_space');
      return true;
    });
    assert.deepEqual(asked, []);
    assert.deepEqual(await readdir(cache), []);
  });

  test("files one of the node's own builds has take no room: the rest is fetched", async () => {
    // 800 bytes free: not the whole build (about 1.6 kB), but all of it but the root filesystem.
    const { cache, copies, asked, fetchInto } = await setUp(800);
    // The node's own build has the same root filesystem (its key differs by its description).
    const own = join(cache, 'templates', 'python', OWN_KEY);
    await mkdir(own, { recursive: true });
    await writeFile(join(own, 'rootfs.erofs'), contents['rootfs.erofs']!);
    await writeFile(join(own, 'manifest.json'), manifestOf(OWN_KEY, ['rootfs.erofs']));
    const dir = await copies.obtain(build, fetchInto);
    assert.ok(copies.isCopy(dir));
    assert.deepEqual(asked.sort(), ['disk.qcow2', 'initrd.cpio', 'manifest.json', 'vmlinux']);
  });
});
