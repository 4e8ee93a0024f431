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

/**
 * What a fork point's image holds over the image it was copied from, when that base is a
 * template's (durable from the moment it was published): a snapshot or a pause makes the state
 * durable by writing and syncing those pages as a page delta (`<id>.delta`) instead of the whole
 * image, most of which is a copy still dirty in the page cache (docs/architecture.md,
 * "Measured choices in the code"). The image itself is synced later, off every request
 * (StateStore, `settleLater`), and the delta then goes.
 */
export interface StateDelta {
  /** The template state the image was copied from. */
  readonly base: QemuState;
  /** The runs [first page, count) of the image that differ from the base. */
  readonly runs: ReadonlyArray<[number, number]>;
}

export class QemuState implements FrozenState {
  /** Null once the image itself is durable, or when its base is not a template's. */
  delta: StateDelta | null = null;

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
