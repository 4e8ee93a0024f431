/**
 * Making files that a record will name survive a power cut, before the record is written: each
 * file's data (fsync), and the directory entries that name them (fsync of each directory,
 * after the file was created or renamed into it). A record written only once this resolves
 * never names a file that a host crash can take away or leave half written.
 *
 * The syncs run at once on libuv's thread pool, never on the event loop: an fsync waits for the
 * disk, the longest of them sets the cost (docs/architecture.md, "Measured choices in the code").
 */
import { open, readdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';

/** The two syncs; tests give a recording fake. */
export interface Syncer {
  file(path: string): Promise<void>;
  dir(path: string): Promise<void>;
}

/** fsync through a read-only descriptor: Linux syncs a file's data whatever the open mode. */
async function fsyncPath(path: string): Promise<void> {
  const fh = await open(path, 'r');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

export const fsSyncer: Syncer = { file: fsyncPath, dir: fsyncPath };

/**
 * Makes `files` durable with the entries naming them: every file synced, and every directory
 * holding one of them (and each of `dirs`: a folder created in its parent, say) synced once,
 * all at the same time. Resolves when all are; rejects with the first failure.
 */
export async function syncAll(
  files: readonly string[],
  dirs: readonly string[] = [],
  syncer: Syncer = fsSyncer,
): Promise<void> {
  const uniqueFiles = [...new Set(files)];
  const uniqueDirs = [...new Set([...uniqueFiles.map((f) => dirname(f)), ...dirs])];
  await Promise.all([
    ...uniqueFiles.map((f) => syncer.file(f)),
    ...uniqueDirs.map((d) => syncer.dir(d)),
  ]);
}

/**
 * Makes folder `dir` durable with everything in it, before the rename that publishes it: every
 * file under it synced, and every folder (itself included), at once (`syncAll`). The rename is
 * then on disk once the folder it was made in is synced (`syncer.dir` of its parent): a power
 * cut finds the folder whole under its name or not at all, never a torn file a reader trusts.
 */
export async function syncTree(dir: string, syncer: Syncer = fsSyncer): Promise<void> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  // `parentPath` is Node 20.12's name for what 20.1 to 20.11 call `path` (engines: >=20).
  const under = (e: { parentPath?: string; path?: string; name: string }): string =>
    join(e.parentPath ?? e.path ?? dir, e.name);
  await syncAll(
    entries.filter((e) => e.isFile()).map(under),
    [dir, ...entries.filter((e) => e.isDirectory()).map(under)],
    syncer,
  );
}

/**
 * Remembers which things (a frozen state, a disk layer: files that never change once made) are
 * durable already, so that each is synced once however many snapshots and pauses name it. A
 * sync that failed is forgotten, and the next one tries again.
 */
export class DurableOnce {
  private readonly done = new WeakMap<object, Promise<void>>();

  constructor(private readonly syncer: Syncer = fsSyncer) {}

  /**
   * Syncs the files and directories of those `items` not synced (or being synced) yet, in one
   * `syncAll`; resolves when every item is durable.
   */
  async sync(
    items: readonly { key: object; files: readonly string[]; dirs?: readonly string[] }[],
  ): Promise<void> {
    const waits: Promise<void>[] = [];
    const fresh = items.filter((item) => {
      const known = this.done.get(item.key);
      if (known) waits.push(known);
      return !known;
    });
    if (fresh.length > 0) {
      const work = syncAll(
        fresh.flatMap((i) => i.files),
        fresh.flatMap((i) => i.dirs ?? []),
        this.syncer,
      );
      for (const item of fresh) this.done.set(item.key, work);
      work.catch(() => {
        for (const item of fresh) if (this.done.get(item.key) === work) this.done.delete(item.key);
      });
      waits.push(work);
    }
    await Promise.all(waits);
  }
}
