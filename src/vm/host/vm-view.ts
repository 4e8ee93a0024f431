/**
 * What a jailed QEMU sees of the data directory (vm/host/vm-jail.ts): one folder of its own, its
 * view, where hostd hard-links each image and disk layer just before QEMU opens it (at start,
 * and at run time for a `blockdev-add` or a read-only reopen) and unlinks it once QEMU has it
 * open: at rest the view is empty. A hard link is the same file (same inode, owner and mode),
 * so a layer read-only through the group stays read-only; and the view is bound into the QEMU's
 * mount namespace as a folder, so a link made later shows there too, with no mount to
 * propagate. Nothing else of the data directory is in that namespace: another sandbox's files,
 * by any name, are not there to open, nor are its own once opened.
 *
 * The data directory must be one filesystem for links (it already must, for the renames
 * between its folders).
 */
import { link, stat, unlink } from 'node:fs/promises';
import { join, relative } from 'node:path';

/** The name QEMU is to open a file by. */
export interface FileView {
  /**
   * The path, in QEMU's mount namespace, of the host file `path` (a file of the data directory
   * is linked into the view first); the same path while the VM lives, whatever the host's file
   * is renamed to since.
   */
  expose(path: string): Promise<string>;
  /** Takes back what `expose` answered `seen`, once QEMU has the file open (or failed to). */
  withdraw(seen: string): Promise<void>;
}

/** The host's own paths: QEMU sees the host's folders (no jail, or one without a view). */
export const HOST_VIEW: FileView = {
  expose: (path) => Promise.resolve(path),
  withdraw: () => Promise.resolve(),
};

export class VmView implements FileView {
  constructor(
    /** The VM's view folder (`Jail.viewDir`). */
    readonly dir: string,
    private readonly dataDir: string,
  ) {}

  async expose(path: string): Promise<string> {
    const rel = relative(this.dataDir, path);
    if (rel.startsWith('..') || rel.startsWith('/')) return path; // the cache's, bound as a folder
    // Its path in the data directory as one name: names of different files never collide.
    const linked = join(this.dir, rel.replaceAll('/', '%'));
    try {
      await link(path, linked);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      // Exposed by an operation that has not withdrawn it yet: fine if it is that file.
      const [a, b] = await Promise.all([stat(path), stat(linked)]);
      if (a.ino !== b.ino || a.dev !== b.dev) {
        throw new Error(`the view of ${path} is another file`);
      }
    }
    return linked;
  }

  /**
   * One `unlink`: `rm` first `lstat`s the name and goes through its recursive machinery, which
   * cost hostd ~0.4 ms of CPU a file, three files a fork child (docs/architecture.md, "Fork: the
   * host's part of a child").
   */
  async withdraw(seen: string): Promise<void> {
    if (!seen.startsWith(`${this.dir}/`)) return;
    try {
      await unlink(seen);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
}
