/**
 * A frozen machine state under QEMU: an immutable guest RAM image, the device state that goes
 * with it and the frozen layer of its writable disk (vm/machine.ts, FrozenState). Its references
 * are its image's; the state holds one reference to its disk layer until its image is freed.
 */
import type { DiskLayer } from '../storage/disk-layer.js';
import type { FrozenState } from '../machine.js';
import type { MemImage } from '../storage/mem-image.js';
import type { MachineSpec } from './qemu-args.js';
import type { Vm } from './vm.js';

export class QemuState implements FrozenState {
  constructor(
    readonly id: string,
    readonly spec: MachineSpec,
    /** tmpfs file holding guest RAM; never written after the state is made. */
    readonly image: MemImage,
    /** QEMU device state without RAM (xen-save-devices-state): about 8 KB. */
    readonly deviceState: Buffer,
    /** Its disk as it was at the instant of `image`: VMs restored from it write overlays of it. */
    readonly layer: DiskLayer | null,
    /** Incoming QEMUs already started on `image`, for this device state; restores take them. */
    readonly incoming: Vm[] = [],
  ) {}

  retain(): this {
    this.image.retain();
    return this;
  }

  release(): void {
    this.image.release();
  }

  async discardPrepared(): Promise<void> {
    await Promise.all(this.incoming.splice(0).map((vm) => vm.destroy()));
  }
}
