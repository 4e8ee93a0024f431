/**
 * The QEMU implementation of vm/machine.ts's Hypervisor: where states live (vm/qemu/state-store.ts),
 * how a template's machine spec is made, and the per-VM memory estimate admission uses.
 */
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { readdir, readFile, rm } from 'node:fs/promises';
import { findProcessesUsing } from '../../state-dir.js';
import type {
  FrozenState,
  Hypervisor,
  MachineDescriptor,
  MachineShape,
  PausedDescriptor,
  PausedMachine,
  StateDescriptor,
  TemplateImage,
} from '../machine.js';
import type { LoadedImage } from '../image/image.js';
import { QemuPaused } from './qemu-paused.js';
import type { MachineSpec } from './qemu-args.js';
import type { QemuHost } from './qemu-process.js';
import { QemuState } from './qemu-state.js';
import { QemuForkTarget } from './fork-target.js';
import { StateStore, templateKey } from './state-store.js';
import { BuiltImage } from '../image/template-images.js';
import { STATE_FORMAT } from '../storage/state-format.js';
import { Vm, type VmContext } from './vm.js';

export class QemuHypervisor implements Hypervisor {
  private readonly ctx: VmContext;
  /** VM folders of earlier runs that this one took over: `sweep` spares them. */
  private readonly adopted = new Set<string>();
  private readonly qemuVersion: string;

  constructor(
    host: QemuHost,
    /** Durable state: frozen templates and memory images (SERVICE_DATA_DIR). */
    dataDir: string,
    /** The full QEMU machine of a template with these resources, booting its built `image`. */
    private readonly specFor: (
      template: string,
      shape: MachineShape,
      image: LoadedImage,
    ) => MachineSpec,
    readonly machineOverheadMib: number,
  ) {
    this.ctx = { host, store: new StateStore(dataDir, host.owner) };
    // A frozen state restores only into the QEMU that made it (device-state formats change).
    // The binary's identity stands for its version: running `--version` costs half a second.
    this.qemuVersion = binaryIdentity(host.qemuBinary);
  }

  /** Creates the state directories; call once before anything else. */
  async init(): Promise<void> {
    await this.ctx.store.init();
  }

  async bootTemplate(
    template: string,
    shape: MachineShape,
    image: TemplateImage,
  ): Promise<FrozenState> {
    if (!(image instanceof BuiltImage)) throw new Error(`not an image of the cache: ${image.key}`);
    // The spec holds the image's key and files, so the frozen template's cache key does too.
    // Templates booted now have the processes port; states frozen earlier keep their machine.
    const spec: MachineSpec = { ...this.specFor(template, shape, image.loaded), procPort: true };
    const key = templateKey(spec, this.qemuVersion);
    const { store } = this.ctx;
    const cached = await store.cachedTemplate(key, spec);
    if (cached) return cached.retain();
    const dir = await store.templateWorkDir(key);
    const vm = await Vm.bootTemplate(
      this.ctx,
      spec,
      join(dir, 'memory.img'),
      join(dir, 'disk.qcow2'),
    );
    const deviceState = await vm.freeze();
    return (await store.publishTemplate(key, dir, spec, deviceState)).retain();
  }

  describeState(state: FrozenState): StateDescriptor {
    return this.ctx.store.describe(ours(state));
  }

  openState(descriptor: StateDescriptor): Promise<FrozenState> {
    return this.ctx.store.open(descriptor);
  }

  collectGarbage(): Promise<number> {
    return this.ctx.store.collectGarbage();
  }

  restore(state: FrozenState): Promise<Vm> {
    return Vm.restore(this.ctx, ours(state));
  }

  async resume(paused: PausedMachine): Promise<Vm> {
    if (!(paused instanceof QemuPaused)) throw new Error('a paused machine of another hypervisor');
    const vm = await Vm.resumePaused(this.ctx, paused);
    await paused.discard();
    return vm;
  }

  openPaused(descriptor: PausedDescriptor): Promise<QemuPaused> {
    return this.ctx.store.openPaused(descriptor);
  }

  async adopt(descriptor: MachineDescriptor): Promise<Vm> {
    if (descriptor.format !== STATE_FORMAT || !/^vm[0-9a-z]+-[0-9a-z]+$/.test(descriptor.id)) {
      throw new Error(`not a machine this hostd can adopt: ${descriptor.id}`);
    }
    const state = await this.ctx.store.open(descriptor.origin);
    const vm = await Vm.adopt(this.ctx, descriptor, state);
    this.adopted.add(descriptor.id);
    return vm;
  }

  async sweep(): Promise<number> {
    const { vmsDir } = this.ctx.host;
    const mine = `vm${process.pid.toString(36)}-`;
    const keep = (id: string): boolean => this.adopted.has(id) || id.startsWith(mine);
    let swept = 0;
    for (const pid of await findProcessesUsing(vmsDir)) {
      const cmd = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
      const id = new RegExp(`${vmsDir}/([^/]+)/`).exec(cmd)?.[1];
      if (id === undefined || keep(id)) continue;
      try {
        process.kill(pid, 'SIGKILL');
        swept++;
      } catch {
        // gone already
      }
    }
    for (const name of await readdir(vmsDir)) {
      if (!keep(name)) await rm(join(vmsDir, name), { recursive: true, force: true });
    }
    return swept;
  }

  prepareForkTarget(base: FrozenState): Promise<QemuForkTarget> {
    return QemuForkTarget.prepare(this.ctx, ours(base));
  }

  forkTargetCostMib(base: FrozenState): number {
    try {
      return (statSync(ours(base).image.path).blocks * 512) / 1024 / 1024;
    } catch {
      return 0;
    }
  }

  stateSizeBytes(state: FrozenState): number {
    const s = ours(state);
    try {
      const disk = s.layer ? this.ctx.store.disks.sizeBytes(s.layer.path) : 0;
      return statSync(s.image.path).blocks * 512 + s.deviceState.length + disk;
    } catch {
      return 0;
    }
  }
}

/** Path, size and modification time of `command` as found on PATH: changes with any upgrade. */
function binaryIdentity(command: string): string {
  const dirs = command.includes('/') ? [''] : (process.env.PATH ?? '').split(':');
  for (const dir of dirs) {
    const path = dir ? join(dir, command) : command;
    try {
      const st = statSync(path);
      if (st.isFile()) return `${path}:${st.size}:${st.mtimeMs}`;
    } catch {
      // not in this directory
    }
  }
  return command;
}

function ours(state: FrozenState): QemuState {
  if (!(state instanceof QemuState)) throw new Error(`state ${state.id} is not a QEMU state`);
  return state;
}
