/**
 * The QEMU implementation of vm/machine.ts's Hypervisor: where states live (vm/qemu/state-store.ts),
 * how a template's machine spec is made, and the per-VM memory estimate admission uses.
 */
import { existsSync, statSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import { readdir, readFile, rm } from 'node:fs/promises';
import { findProcessesUsing } from '../../state-dir.js';
import { findCommand } from '../host/command-path.js';
import type {
  ExportedRead,
  FileFetcher,
  FrozenState,
  PausedManifest,
  Hypervisor,
  MachineDescriptor,
  MachineShape,
  PausedDescriptor,
  PausedMachine,
  StateDescriptor,
  StateManifest,
  TemplateImage,
  RunTurn,
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
import { VmError } from '../vm-error.js';
import { asVmError } from './as-vm-error.js';

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
    /**
     * The template image cache: builds of other nodes' paused sandboxes and snapshots taken over
     * here are copied into it (vm/image/build-copies.ts). Without it none are.
     */
    cacheDir?: string,
  ) {
    this.ctx = {
      host: { ...host, dataDir },
      store: new StateStore(dataDir, host.jail?.group, cacheDir),
    };
    // A frozen state restores only into the QEMU that made it (device-state formats change).
    // The binary's identity stands for its version: running `--version` costs half a second.
    this.qemuVersion = binaryIdentity(host.qemuBinary);
  }

  /** Creates the state directories; call once before anything else. */
  async init(): Promise<void> {
    await this.ctx.store.init();
  }

  bootTemplate(template: string, shape: MachineShape, image: TemplateImage): Promise<FrozenState> {
    return asVmError('boot', () => this.boot(template, shape, image));
  }

  private async boot(
    template: string,
    shape: MachineShape,
    image: TemplateImage,
  ): Promise<FrozenState> {
    if (!(image instanceof BuiltImage)) {
      throw new VmError('unsupported', `not an image of the cache: ${image.key}`);
    }
    // The spec holds the image's key and files, so the frozen template's cache key does too.
    // Templates booted now have the processes port and one IO-APIC; states frozen earlier keep
    // their machine.
    const spec: MachineSpec = {
      ...this.specFor(template, shape, image.loaded),
      procPort: true,
      oneIoapic: true,
    };
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
    if (image.warmup !== '') {
      await vm.runWarmup(image.warmup).catch(async (err: unknown) => {
        await vm.destroy();
        throw err;
      });
    }
    const deviceState = await vm.freeze();
    return (await store.publishTemplate(key, dir, spec, deviceState)).retain();
  }

  describeState(state: FrozenState): StateDescriptor {
    return this.ctx.store.describe(ours(state));
  }

  openState(descriptor: StateDescriptor): Promise<FrozenState> {
    return asVmError('open_state', () => this.ctx.store.open(descriptor));
  }

  collectGarbage(): Promise<number> {
    return this.ctx.store.collectGarbage();
  }

  restore(state: FrozenState, turn?: RunTurn): Promise<Vm> {
    return asVmError('restore', () => Vm.restore(this.ctx, ours(state), turn));
  }

  resume(paused: PausedMachine): Promise<Vm> {
    return asVmError('resume', async () => {
      if (!(paused instanceof QemuPaused)) {
        throw new VmError('unsupported', 'a paused machine of another hypervisor');
      }
      const vm = await Vm.resumePaused(this.ctx, paused);
      await paused.discard();
      return vm;
    });
  }

  exportPaused(paused: PausedMachine): Promise<PausedManifest> {
    return asVmError('export', async () => {
      if (!(paused instanceof QemuPaused)) {
        throw new VmError('unsupported', 'a paused machine of another hypervisor');
      }
      return this.ctx.store.transfer.export(paused);
    });
  }

  readExported(path: string, offset: number): Promise<ExportedRead> {
    return asVmError('export', () => this.ctx.store.transfer.read(path, offset));
  }

  importPaused(manifest: PausedManifest, fetch: FileFetcher): Promise<QemuPaused> {
    return asVmError('import', () => this.ctx.store.transfer.import(manifest, fetch));
  }

  exportState(state: FrozenState): Promise<StateManifest> {
    return asVmError('export', () => this.ctx.store.transfer.exportState(ours(state)));
  }

  persistState(state: FrozenState): Promise<void> {
    // The end of a snapshot's capture: its failures are the capture's.
    return asVmError('capture', () => this.ctx.store.persistState(ours(state)));
  }

  importState(manifest: StateManifest, fetch: FileFetcher): Promise<QemuState> {
    return asVmError('import', () => this.ctx.store.transfer.importState(manifest, fetch));
  }

  openPaused(descriptor: PausedDescriptor): Promise<QemuPaused> {
    return asVmError('open_paused', () => this.ctx.store.openPaused(descriptor));
  }

  adopt(descriptor: MachineDescriptor): Promise<Vm> {
    return asVmError('adopt', async () => {
      if (descriptor.format !== STATE_FORMAT || !/^vm[0-9a-z]+-[0-9a-z]+$/.test(descriptor.id)) {
        throw new VmError('state_corrupt', `not a machine this hostd can adopt: ${descriptor.id}`);
      }
      const state = await asVmError('open_state', () => this.ctx.store.open(descriptor.origin));
      const vm = await Vm.adopt(this.ctx, descriptor, state);
      this.adopted.add(descriptor.id);
      return vm;
    });
  }

  async sweep(): Promise<number> {
    const { vmsDir } = this.ctx.host;
    const mine = `vm${process.pid.toString(36)}-`;
    const keep = (id: string): boolean => this.adopted.has(id) || id.startsWith(mine);
    const killed: number[] = [];
    for (const pid of await findProcessesUsing(vmsDir)) {
      // Expected: a process that exited since it was listed has no command line (''): skipped.
      const cmd = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
      const id = new RegExp(`${vmsDir}/([^/]+)/`).exec(cmd)?.[1];
      if (id === undefined || keep(id)) continue;
      try {
        process.kill(pid, 'SIGKILL');
        killed.push(pid);
      } catch {
        // gone already
      }
    }
    for (const name of await readdir(vmsDir)) {
      if (!keep(name)) await rm(join(vmsDir, name), { recursive: true, force: true });
    }
    // The views of jailed VMs (vm/host/vm-view.ts) that are gone.
    const viewsDir = this.ctx.host.jail?.viewDir('')?.replace(/\/$/, '');
    if (viewsDir && existsSync(viewsDir)) {
      for (const name of await readdir(viewsDir)) {
        if (!keep(name)) await rm(join(viewsDir, name), { recursive: true, force: true });
      }
    }
    if (this.ctx.host.jail) {
      // A leaf empties only once the killed QEMUs are gone; one still busy after that is
      // swept at the next start.
      await processesGone(killed, 5_000);
      this.ctx.host.jail.sweep();
    }
    return killed.length;
  }

  prepareForkTarget(base: FrozenState): Promise<QemuForkTarget> {
    return asVmError('prepare_fork', () => QemuForkTarget.prepare(this.ctx, ours(base)));
  }

  forkTargetCostMib(base: FrozenState): number {
    try {
      return (statSync(ours(base).image.path).blocks * 512) / 1024 / 1024;
    } catch {
      // Expected: a state whose image was freed meanwhile; preparing for it fails by itself.
      return 0;
    }
  }

  stateSizeBytes(state: FrozenState): number {
    const s = ours(state);
    try {
      const disk = s.layer ? this.ctx.store.disks.sizeBytes(s.layer.path) : 0;
      return statSync(s.image.path).blocks * 512 + s.deviceState.length + disk;
    } catch {
      // Expected: a state freed meanwhile (its snapshot deleted): it takes no space any more.
      return 0;
    }
  }
}

/** Waits, at most `ms`, until none of `pids` exists any more. */
async function processesGone(pids: readonly number[], ms: number): Promise<void> {
  const until = Date.now() + ms;
  const alive = (pid: number): boolean => existsSync(`/proc/${pid}`);
  while (pids.some(alive) && Date.now() < until) await sleep(20);
}

/** Path, size and modification time of `command` as found on PATH: changes with any upgrade. */
function binaryIdentity(command: string): string {
  const found = findCommand(command);
  return found ? `${found.path}:${found.size}:${found.mtimeMs}` : command;
}

function ours(state: FrozenState): QemuState {
  if (!(state instanceof QemuState)) {
    throw new VmError('unsupported', `state ${state.id} is not a QEMU state`);
  }
  return state;
}
