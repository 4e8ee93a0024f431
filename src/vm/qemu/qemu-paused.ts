/**
 * A machine paused to disk under QEMU (vm/machine.ts, PausedMachine): the pages it had written
 * since its origin state (a page delta file, vm/storage/page-delta.ts) and its device state, in
 * `paused/<id>/` of the data directory, with its writable disk's overlay (`disk.qcow2`, and
 * `disk.json` naming the layer under it). It holds a reference to its origin, whose image the
 * delta applies to, and to that layer, until it is resumed or discarded.
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { DiskLayer } from '../storage/disk-layer.js';
import type { PausedDescriptor, PausedMachine } from '../machine.js';
import type { QemuState } from './qemu-state.js';
import { STATE_FORMAT } from '../storage/state-format.js';

export class QemuPaused implements PausedMachine {
  private done = false;

  constructor(
    readonly id: string,
    readonly dir: string,
    /** Retained for as long as this paused machine exists. */
    readonly origin: QemuState,
    readonly deviceState: Buffer,
    readonly sizeBytes: number,
    private readonly onGone: () => void,
    /** Its disk's overlay and the layer under it (retained), when the machine has a disk. */
    readonly disk: { readonly path: string; readonly layer: DiskLayer | null } | null = null,
  ) {}

  get deltaPath(): string {
    return join(this.dir, 'memory.delta');
  }

  describe(): PausedDescriptor {
    return {
      format: STATE_FORMAT,
      id: this.id,
      origin: { format: STATE_FORMAT, id: this.origin.id, spec: this.origin.spec },
    };
  }

  async discard(): Promise<void> {
    if (this.done) return;
    this.done = true;
    await rm(this.dir, { recursive: true, force: true });
    this.onGone();
    this.origin.release();
    this.disk?.layer?.release();
  }
}
