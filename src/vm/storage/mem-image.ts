/**
 * A guest RAM image file (a template's or a fork point's), shared copy-on-write by every VM
 * restored from it. It must outlive all of them and no longer: each VM and each state holds a
 * reference, and the file (with its companions, e.g. the device state) is deleted when the last
 * one lets go, unless the image is kept (a cached template).
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, lchown, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { SharedFile } from './shared-file.js';

const run = promisify(execFile);

export class MemImage extends SharedFile {
  /**
   * Copies `from` to `to`, keeping holes (zero pages cost nothing) and sharing blocks where the
   * filesystem can (reflinks on XFS or btrfs make the copy instant). With jailed QEMUs, the copy
   * is root's and read-write for their `group`: QEMU 7.2 maps a RAM file only from a read-write
   * descriptor, even a private copy-on-write mapping.
   */
  static async copy(from: string, to: string, group?: number): Promise<void> {
    try {
      await run('cp', ['--sparse=always', '--reflink=auto', from, to]);
      if (group !== undefined) {
        await lchown(to, 0, group);
        await chmod(to, 0o660);
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
