/**
 * A guest RAM image file (a template's or a fork point's), shared copy-on-write by every VM
 * restored from it. It must outlive all of them and no longer: each VM and each state holds a
 * reference, and the file (with its companions, e.g. the device state) is deleted when the last
 * one lets go, unless the image is kept (a cached template).
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, lchown, lstat, readdir, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { SharedFile } from './shared-file.js';
import { readZeroPages, type ZeroPages } from './zero-pages.js';

const run = promisify(execFile);

/**
 * A RAM image's mode once made, with jailed QEMUs: root's, readable by their group, writable by
 * none of them. QEMUs map it copy-on-write, which needs only read access; QEMU 7.2's read-write
 * open of it is retried read-only by vm/host/ram-open-shim.ts.
 */
export const RAM_IMAGE_MODE = 0o640;

/** The RAM images of a data directory's `templates/` and `images/` (older ones were 0660). */
export async function closeRamImages(templatesDir: string, imagesDir: string): Promise<number> {
  const paths = [
    ...(await readdir(templatesDir).catch(() => [])).map((k) =>
      join(templatesDir, k, 'memory.img'),
    ),
    ...(await readdir(imagesDir).catch(() => []))
      .filter((f) => f.endsWith('.mem'))
      .map((f) => join(imagesDir, f)),
  ];
  let closed = 0;
  for (const path of paths) {
    const st = await lstat(path).catch(() => null);
    if (!st?.isFile() || (st.mode & 0o022) === 0) continue;
    await chmod(path, st.mode & 0o7755);
    closed++;
  }
  return closed;
}

export class MemImage extends SharedFile {
  private zero: ZeroPages | null = null;
  private learning: Promise<void> | null = null;

  /**
   * Starts learning, in the background, which of the image's pages are holes (zero-pages.ts),
   * once; call it when the image is complete and will not be written again. Until that is
   * known, and if it cannot be, `zeroPages` is null.
   */
  learnZeroPages(): void {
    // Expected: no perl, a filesystem that fails lseek, a file gone: only a cost, as a pause
    // then reads the base's pages, as it always did.
    this.learning ??= readZeroPages(this.path).then(
      (zero) => void (this.zero = zero),
      () => undefined,
    );
  }

  /** The image's pages known to be zero, if learnt (learnZeroPages); else null. */
  get zeroPages(): ZeroPages | null {
    return this.zero;
  }

  /** Settles once learnZeroPages is done, or at once if it was not called; a pause waits here. */
  async zeroPagesLearnt(): Promise<ZeroPages | null> {
    await this.learning;
    return this.zero;
  }

  /**
   * Copies `from` to `to`, keeping holes (zero pages cost nothing) and sharing blocks where the
   * filesystem can (reflinks on XFS or btrfs make the copy instant). With jailed QEMUs, the copy
   * is root's and readable by their `group` (RAM_IMAGE_MODE).
   */
  static async copy(from: string, to: string, group?: number): Promise<void> {
    try {
      await run('cp', ['--sparse=always', '--reflink=auto', from, to]);
      if (group !== undefined) {
        await lchown(to, 0, group);
        await chmod(to, RAM_IMAGE_MODE);
      }
    } catch (err) {
      await rm(to, { force: true });
      throw err;
    }
  }

  /** A fresh name for an image of `kind` in `dir`. */
  static freshName(dir: string, kind: 'fork' | 'spare'): string {
    return join(dir, `${kind}-${randomBytes(8).toString('hex')}.mem`);
  }

  /** A fresh name for an image of `kind` next to `path`. */
  static sibling(path: string, kind: 'fork' | 'spare'): string {
    return MemImage.freshName(dirname(path), kind);
  }
}
