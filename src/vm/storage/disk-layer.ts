/**
 * A frozen layer of VMs' writable disks: a qcow2 file that no VM writes any more (a template's
 * disk after its boot, a fork point's or snapshot's disk, captured at the same paused instant as
 * its memory). It holds only the clusters written while it was a VM's overlay; reads of the rest
 * go to `backing`, down to the template's empty disk. VMs write to overlays of their own above it.
 *
 * Like a memory image (vm/storage/mem-image.ts), a layer must outlive everything reading it and no
 * more: each holder (a frozen state, a VM or a paused machine whose overlay sits on it, and each
 * layer above it) holds a reference. The last release deletes its files, unless it is kept (a
 * cached template's), and then releases its backing: freeing a fork point frees the layers
 * only it used, and spares the ones others still read.
 */
import { SharedFile, type SharedFileOptions } from './shared-file.js';

export class DiskLayer extends SharedFile {
  /**
   * `backing` is the layer under this one (null: the template's empty disk); the new layer
   * takes over one reference to it from the caller, given back when this layer is freed.
   */
  constructor(
    readonly id: string,
    path: string,
    readonly backing: DiskLayer | null,
    options: SharedFileOptions = {},
  ) {
    super(path, options);
  }

  /** Layers from the bottom (just above the template's empty disk) to this one. */
  chain(): DiskLayer[] {
    return [...(this.backing?.chain() ?? []), this];
  }

  override retain(): this {
    if (this.freed) throw new Error(`disk layer ${this.id} was retained after it was freed`);
    return super.retain();
  }

  protected override onFreed(): void {
    this.backing?.release();
  }
}
