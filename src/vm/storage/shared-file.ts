/**
 * A file that several holders share and that must outlive all of them and no longer: each holds
 * a reference, and the last release deletes the file and its companions, unless it is kept (a
 * cached template's). Memory images (vm/storage/mem-image.ts) and disk layers (vm/storage/disk-layer.ts) are
 * such files.
 */
import { rm } from 'node:fs/promises';

export interface SharedFileOptions {
  /** Other files that go with it (a device state, a record). */
  readonly companions?: readonly string[];
  /** Never delete the files (a cached template's): the last release only forgets it. */
  readonly keep?: boolean;
  /** Called once when the last reference goes (before what `onFreed` lets go of). */
  readonly onFree?: () => void;
  /** Deletes a file; tests record instead. */
  readonly remove?: (path: string) => Promise<void>;
}

export class SharedFile {
  private refs = 0;
  private isFreed = false;

  constructor(
    readonly path: string,
    private readonly options: SharedFileOptions = {},
  ) {}

  get references(): number {
    return this.refs;
  }

  /** True once the last reference went. */
  protected get freed(): boolean {
    return this.isFreed;
  }

  retain(): this {
    this.refs++;
    return this;
  }

  release(): void {
    if (this.refs <= 0) return;
    this.refs--;
    if (this.refs > 0 || this.isFreed) return;
    this.isFreed = true;
    if (!this.options.keep) {
      const remove = this.options.remove ?? ((p: string) => rm(p, { force: true }));
      for (const p of [this.path, ...(this.options.companions ?? [])]) void remove(p);
    }
    this.options.onFree?.();
    this.onFreed();
  }

  /** What a subclass lets go of once its files are gone (a disk layer: its backing). */
  protected onFreed(): void {}
}
