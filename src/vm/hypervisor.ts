/**
 * The QEMU implementation of vm/machine.ts's Hypervisor: where images live, how a template's
 * machine spec is made, and the per-VM memory estimate admission uses.
 */
import { statSync } from 'node:fs';
import { join } from 'node:path';
import type { FrozenState, Hypervisor, MachineShape } from './machine.js';
import type { MachineSpec } from './qemu-args.js';
import type { QemuHost } from './qemu-process.js';
import { QemuState } from './qemu-state.js';
import { QemuForkTarget } from './fork-target.js';
import { Vm } from './vm.js';

export class QemuHypervisor implements Hypervisor {
  constructor(
    private readonly host: QemuHost,
    /** Where RAM images go: a tmpfs, so that they cost memory, not disk I/O. */
    private readonly imagesDir: string,
    /** The full QEMU machine of a template with these resources. */
    private readonly specFor: (template: string, shape: MachineShape) => MachineSpec,
    readonly machineOverheadMib: number,
  ) {}

  async bootTemplate(template: string, shape: MachineShape): Promise<FrozenState> {
    const memPath = join(this.imagesDir, `template-${template}.mem`);
    const vm = await Vm.bootTemplate(this.host, this.specFor(template, shape), memPath);
    return vm.freezeAsTemplate(memPath);
  }

  restore(state: FrozenState): Promise<Vm> {
    return Vm.restore(this.host, ours(state));
  }

  prepareForkTarget(base: FrozenState): Promise<QemuForkTarget> {
    return QemuForkTarget.prepare(this.host, ours(base));
  }

  forkTargetCostMib(base: FrozenState): number {
    try {
      return (statSync(ours(base).image.path).blocks * 512) / 1024 / 1024;
    } catch {
      return 0;
    }
  }
}

function ours(state: FrozenState): QemuState {
  if (!(state instanceof QemuState)) throw new Error(`state ${state.id} is not a QEMU state`);
  return state;
}
