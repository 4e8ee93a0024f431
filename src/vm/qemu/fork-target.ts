/**
 * Work done ahead for a fork (vm/machine.ts, ForkTarget), under QEMU. A fork of a sandbox
 * restored from a template needs a copy of the template image (hundreds of MB, a few hundred ms)
 * and one new QEMU per child (~35 ms of CPU each, most of it exec and dynamic linking). A target
 * is that copy made ahead, with incoming QEMUs already started on it and waiting for a device
 * state (`Vm.incoming`): a fork takes it, writes its parent's pages into the copy, and resumes the
 * incoming QEMUs as its children. How many there are, and when targets are made, is core's policy
 * (core/fork-standby.ts).
 */
import { rename, rm } from 'node:fs/promises';
import type { ForkTarget } from '../machine.js';
import { MemImage } from '../storage/mem-image.js';
import type { QemuState } from './qemu-state.js';
import { Vm, type PreparedCopy, type VmContext } from './vm.js';

export class QemuForkTarget implements ForkTarget, PreparedCopy {
  private readonly vms: Vm[] = [];
  private taken = false;
  private discarded = false;

  private constructor(
    private readonly ctx: VmContext,
    readonly base: QemuState,
    private readonly image: MemImage,
  ) {}

  /** Copies `base`'s image; the target holds a reference to `base` until taken or discarded. */
  static async prepare(ctx: VmContext, base: QemuState): Promise<QemuForkTarget> {
    const path = ctx.store.newImagePath('spare');
    await MemImage.copy(base.image.path, path, ctx.host.jail?.group);
    return new QemuForkTarget(ctx, base.retain(), new MemImage(path).retain());
  }

  get incoming(): number {
    return this.vms.filter((vm) => vm.isIncoming).length;
  }

  async addIncoming(): Promise<void> {
    if (this.taken) return;
    const disk = await Vm.unattachedDisk(this.ctx, this.base.spec);
    const vm = await Vm.incoming(this.ctx, this.base.spec, this.image.path, disk);
    // Every fork that takes this target captures a machine restored from `base`: its children's
    // disks sit on `base`'s layer, and their QEMUs can open it now, outside the fork. A failure
    // destroyed the VM; it ends the fill, as a failed start does, once the image is seen to.
    let failure: unknown = null;
    await vm.readyForFork(this.base).catch((err: unknown) => (failure = err));
    if (this.taken) {
      // Taken while this QEMU started: the fork did not get it.
      await vm.destroy();
      // Discarded before QEMU opened the image, it may have created an empty file in its place
      // (it can when it runs as hostd's own user).
      if (this.discarded) await rm(this.image.path, { force: true });
      return;
    }
    if (failure) throw failure;
    this.vms.push(vm);
  }

  /**
   * Renames the image copy to `path`, a fork's image, and hands over the incoming QEMUs, for one
   * fork. The QEMUs opened the file already: the rename does not disturb them.
   */
  async take(path: string): Promise<Vm[]> {
    if (this.taken) throw new Error('fork target taken twice');
    this.taken = true;
    this.base.release();
    const incoming = this.vms.splice(0);
    try {
      await rename(this.image.path, path);
    } catch (err) {
      await Promise.all(incoming.map((vm) => vm.destroy()));
      this.image.release();
      throw err;
    }
    return incoming;
  }

  async discard(): Promise<void> {
    if (this.taken) return;
    this.taken = this.discarded = true;
    this.base.release();
    await Promise.all(this.vms.splice(0).map((vm) => vm.destroy()));
    this.image.release(); // its only reference: the file goes
  }
}
