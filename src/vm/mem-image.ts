/**
 * A guest RAM image file on tmpfs (a template's or a fork point's), shared copy-on-write by
 * every VM restored from it. It must outlive all of them and no longer: each VM and each
 * state holds a reference, and the file is deleted when the last one lets go.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { lchown, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export class MemImage {
  private refs = 0;
  private removed = false;

  constructor(readonly path: string) {}

  /**
   * A new image holding a copy of `from`, next to it, with one reference. Holes are kept (zero
   * pages cost nothing on tmpfs), and the copy belongs to QEMU's account when QEMU runs as one.
   * Its name starts with `kind`: a fork's image, or a spare copy made ahead for the next fork.
   */
  static async copyOf(
    from: MemImage,
    owner?: { uid: number; gid: number },
    kind: 'fork' | 'spare' = 'fork',
  ): Promise<MemImage> {
    const to = MemImage.sibling(from.path, kind);
    try {
      await run('cp', ['--sparse=always', from.path, to]);
      if (owner) await lchown(to, owner.uid, owner.gid);
    } catch (err) {
      await rm(to, { force: true });
      throw err;
    }
    return new MemImage(to).retain();
  }

  /** A fresh name for an image of `kind` in the directory of `path`. */
  static sibling(path: string, kind: 'fork' | 'spare'): string {
    return join(dirname(path), `${kind}-${randomBytes(8).toString('hex')}.mem`);
  }

  retain(): this {
    this.refs++;
    return this;
  }

  release(): void {
    if (this.refs <= 0) return;
    this.refs--;
    if (this.refs === 0 && !this.removed) {
      this.removed = true;
      void rm(this.path, { force: true });
    }
  }
}
