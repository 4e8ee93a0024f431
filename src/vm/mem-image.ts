/**
 * A guest RAM image file on tmpfs (a template's or a fork point's), shared copy-on-write by
 * every VM restored from it. It must outlive all of them and no longer: each VM and each
 * snapshot holds a reference, and the file is deleted when the last one lets go.
 */
import { rm } from 'node:fs/promises';

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
