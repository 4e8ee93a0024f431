/**
 * Ready-made copies of template images. A fork starts by copying its parent's base image
 * (hundreds of MB, a few hundred ms); most parents are restored from a template, so keeping
 * one copy of each template image ready takes that copy off the fork's critical path. The
 * price is one image's worth of tmpfs per template.
 */
import { execFile } from 'node:child_process';
import { lchown, rename, rm } from 'node:fs/promises';
import { promisify } from 'node:util';
import { randomBytes } from 'node:crypto';
import { dirname, join } from 'node:path';

const run = promisify(execFile);

export class SpareCopies {
  private readonly ready = new Map<string, string>();
  private readonly making = new Set<string>();
  private closed = false;

  constructor(private readonly owner?: { uid: number; gid: number }) {}

  /** Keeps a copy of `base` ready from now on. */
  register(base: string): void {
    this.make(base);
  }

  /**
   * Moves a ready copy of `base` to `target` and starts making the next one. Returns false when
   * none is ready (the caller copies itself).
   */
  async take(base: string, target: string): Promise<boolean> {
    const spare = this.ready.get(base);
    if (!spare) return false;
    this.ready.delete(base);
    await rename(spare, target);
    this.make(base);
    return true;
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.ready.values()].map((p) => rm(p, { force: true })));
    this.ready.clear();
  }

  private make(base: string): void {
    if (this.closed || this.making.has(base) || this.ready.has(base)) return;
    this.making.add(base);
    const path = join(dirname(base), `spare-${randomBytes(6).toString('hex')}.mem`);
    void (async () => {
      try {
        await run('cp', ['--sparse=always', base, path]);
        if (this.owner) await lchown(path, this.owner.uid, this.owner.gid);
        if (this.closed) await rm(path, { force: true });
        else this.ready.set(base, path);
      } catch {
        await rm(path, { force: true });
      } finally {
        this.making.delete(base);
      }
    })();
  }
}
