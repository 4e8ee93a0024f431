/**
 * A guest RAM image file on tmpfs (a template's or a fork point's), shared copy-on-write by
 * every VM restored from it. It must outlive all of them and no longer: each VM and each
 * snapshot holds a reference, and the file is deleted when the last one lets go.
 */
import { execFile } from 'node:child_process';
import { lchown, rm } from 'node:fs/promises';
import { promisify } from 'node:util';

const run = promisify(execFile);

/**
 * Copies image file `from` to `to`, keeping its holes (zero pages cost nothing on tmpfs), and
 * gives the copy to QEMU's account when QEMU runs as one (`owner`): a fork's image and a spare
 * copy are both made this way.
 */
export async function copyImage(
  from: string,
  to: string,
  owner?: { uid: number; gid: number },
): Promise<void> {
  await run('cp', ['--sparse=always', from, to]);
  if (owner) await lchown(to, owner.uid, owner.gid);
}

export class MemImage {
  private refs = 0;
  private removed = false;

  constructor(readonly path: string) {}

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
