/**
 * A machine (vm/machine.ts) made of one QEMU process and the guest agent's channel.
 *
 * Life cycle: a template VM is cold-booted once per template (`Vm.bootTemplate`) and frozen
 * into a `QemuState` (its RAM file + device state). Every sandbox VM is a restore of a state: a
 * QEMU started on the state's RAM file (`Vm.standby`, a copy-on-write mapping, so it costs only
 * the pages it writes) that is then fed the device state (`resume`). A fork captures a running
 * VM into a new state (`capture`) and restores its children from it.
 */
import { execFile } from 'node:child_process';
import { statSync } from 'node:fs';
import { promisify } from 'node:util';
import { AgentChannel } from './agent-channel.js';
import type { CancelReason, ExecSink, ExecSpec, ForkTarget, Machine } from './machine.js';
import { MemImage } from './mem-image.js';
import { copyWrittenPages } from './page-delta.js';
import type { MachineSpec } from './qemu-args.js';
import { QemuProcess, VmError, type QemuHost } from './qemu-process.js';
import { QemuState } from './qemu-state.js';

const run = promisify(execFile);

/** Timeouts, generous for TCG on a loaded 2-core machine. */
const BOOT_TIMEOUT_MS = 120_000;
const RESTORE_TIMEOUT_MS = 30_000;
const HELLO_TIMEOUT_MS = 30_000;
const WARM_UP_TIMEOUT_MS = 30_000;

let stateCounter = 0;

/** A copy of a VM's base image made ahead, with standby QEMUs on it (vm/fork-target.ts). */
export interface PreparedCopy {
  take(): Promise<{ image: MemImage; standby: Vm[] }>;
}

function isPreparedCopy(target: unknown): target is PreparedCopy {
  return typeof (target as PreparedCopy | null)?.take === 'function';
}

export class Vm implements Machine {
  private agent: AgentChannel | null = null;
  /** The image this VM's RAM is a private copy-on-write mapping of (null for a template). */
  private base: MemImage | null = null;
  private state: QemuState | null = null;
  private destroyed = false;
  private deathListener: ((why: string) => void) | null = null;
  private deathReported = false;

  private constructor(
    readonly process: QemuProcess,
    readonly spec: MachineSpec,
  ) {
    process.once('exit', (info: string) => {
      this.agent?.close();
      this.reportDeath(`the VM exited (${info})`);
    });
  }

  get id(): string {
    return this.process.id;
  }

  get origin(): QemuState | null {
    return this.state;
  }

  /** Cold-boots a template VM whose RAM is the shared file `memPath`, waits for its agent. */
  static async bootTemplate(host: QemuHost, spec: MachineSpec, memPath: string): Promise<Vm> {
    const deadline = Date.now() + BOOT_TIMEOUT_MS;
    const vm = new Vm(
      await QemuProcess.start(host, spec, { kind: 'template', memPath }, deadline),
      spec,
    );
    try {
      await vm.connectAgent(deadline);
      await vm.requireAgent().hello(BOOT_TIMEOUT_MS);
      return vm;
    } catch (err) {
      throw await vm.process.failed(err);
    }
  }

  /**
   * Starts QEMU on the RAM file `memPath` waiting for a device state (`-incoming defer`), with
   * its agent socket connected. Such a QEMU has not touched guest RAM yet, so it resumes with
   * whatever the file holds by then: a fork can start its children's QEMUs before it has
   * written the parent's pages (core's fork standby starts them before the fork is asked for).
   */
  static async standby(host: QemuHost, spec: MachineSpec, memPath: string): Promise<Vm> {
    const deadline = Date.now() + RESTORE_TIMEOUT_MS;
    const vm = new Vm(
      await QemuProcess.start(host, spec, { kind: 'clone', memPath }, deadline),
      spec,
    );
    try {
      // Connected before the device state loads, the agent port is "host connected" on both
      // sides of the restore, as it was when the snapshot was taken. Connecting after `cont`
      // flipped it closed then open: the guest agent saw EOF, slept, and the first restore
      // work the guest did was noise (~20-50 ms under TCG).
      await vm.connectAgent(deadline);
      return vm;
    } catch (err) {
      throw await vm.process.failed(err);
    }
  }

  /**
   * A running machine in `state`: one of the standby QEMUs on its image when there is one, else
   * a new one. Holds a reference to the state's image from before QEMU opens the file, so that
   * the image cannot be deleted under it.
   */
  static async restore(host: QemuHost, state: QemuState): Promise<Vm> {
    state.retain();
    let vm: Vm | undefined;
    try {
      while ((vm = state.standby.pop()) && !vm.isStandby) void vm.destroy();
      vm ??= await Vm.standby(host, state.spec, state.image.path);
    } catch (err) {
      state.release();
      throw err;
    }
    await vm.resume(state);
    return vm;
  }

  /** True while this VM (made by `standby`) waits, alive and unused, for a device state. */
  get isStandby(): boolean {
    return this.state === null && this.alive;
  }

  /** Loads `state`'s device state into this standby VM, runs it, and waits for hello. */
  private async resume(state: QemuState): Promise<void> {
    this.state = state; // takes over the caller's reference
    this.base = state.image;
    try {
      await this.process.loadDeviceState(state.deviceState, Date.now() + RESTORE_TIMEOUT_MS);
      await this.requireAgent().hello(HELLO_TIMEOUT_MS);
    } catch (err) {
      throw await this.process.failed(err);
    }
  }

  get alive(): boolean {
    return !this.process.exited && !this.destroyed && this.agent !== null && !this.agent.closed;
  }

  get deathReason(): string {
    if (this.process.exited) return `the VM exited (${this.process.exitDescription})`;
    if (this.agent?.closed) return 'the guest agent connection was lost';
    return 'the VM is not running';
  }

  onDeath(listener: ((why: string) => void) | null): void {
    this.deathListener = listener;
  }

  exec(spec: ExecSpec, sink: ExecSink): number {
    return this.requireAgent().exec(spec, sink);
  }

  cancel(execId: number, reason: CancelReason): void {
    this.agent?.cancel(execId, reason);
  }

  pauseOutput(): void {
    this.agent?.pause();
  }

  resumeOutput(): void {
    this.agent?.resume();
  }

  /**
   * A restored VM is a new QEMU process whose TCG translation cache is empty: its first exec
   * took ~470 ms against ~25 ms for the next ones. Pool VMs pay that in the background.
   */
  warmUp(): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new VmError('warm-up exec did not finish')),
        WARM_UP_TIMEOUT_MS,
      );
      const done = (err?: Error): void => {
        clearTimeout(timer);
        if (err) reject(err);
        else resolve();
      };
      try {
        this.exec(
          { language: 'python', code: 'print(1)' },
          {
            onOutput: () => undefined,
            onExit: () => done(),
            onLost: (reason) => done(new VmError(reason)),
          },
        );
      } catch (err) {
        done(err as Error);
      }
    });
  }

  /**
   * Freezes this template VM: its RAM already lives in the shared file `memPath`, so only the
   * device state is saved; the VM is then destroyed so that the file never changes again.
   * Zero pages are turned into holes, which halves the file on a fresh guest.
   */
  async freezeAsTemplate(memPath: string): Promise<QemuState> {
    await this.process.qmp.execute('stop');
    const deviceState = await this.process.saveDeviceState();
    await this.destroy();
    await run('fallocate', ['--dig-holes', memPath]);
    return new QemuState(
      `template-${++stateCounter}`,
      this.spec,
      new MemImage(memPath).retain(),
      deviceState,
    );
  }

  /**
   * Captures this clone's whole state as a new QemuState whose RAM image is a copy of its base
   * image (made while the guest runs, or taken ready-made from `target`) plus the pages it has
   * written (copied while it is paused, together with the device state). The guest is paused for
   * milliseconds. The state comes with `target`'s standby QEMUs (maybe more or fewer than
   * `children`); `restore` uses them first and the caller destroys the rest.
   */
  async capture(children: number, target: ForkTarget | null): Promise<QemuState> {
    void children; // the standby QEMUs were sized by core's fork standby policy
    const { base } = this;
    const pid = this.process.pid;
    if (!base || pid === undefined) throw new VmError('only a running clone can be captured');
    if (target && !isPreparedCopy(target)) throw new Error('a fork target of another hypervisor');
    // A target that cannot be taken is only a lost speed-up: copy the base here instead.
    const taken = target ? await target.take().catch(() => null) : null;
    const image = taken?.image ?? (await MemImage.copyOf(base, this.process.host.owner));
    const standby = taken?.standby ?? [];
    try {
      const qmp = this.process.qmp;
      await qmp.execute('stop');
      try {
        const deviceState = await this.process.saveDeviceState();
        await copyWrittenPages(pid, base.path, this.spec.memoryMib * 1024 * 1024, image.path);
        return new QemuState(`fork-${++stateCounter}`, this.spec, image, deviceState, standby);
      } finally {
        await qmp.execute('cont');
      }
    } catch (err) {
      for (const vm of standby) void vm.destroy();
      image.release();
      throw err;
    }
  }

  captureCostMib(): number {
    if (!this.base) return 0;
    try {
      return (statSync(this.base.path).blocks * 512) / 1024 / 1024;
    } catch {
      return 0;
    }
  }

  /**
   * Kills QEMU and removes every file of this VM. Safe to call more than once. A running exec
   * ends with `reason` as its executor error.
   */
  async destroy(reason = 'the VM was destroyed'): Promise<void> {
    if (!this.destroyed) {
      this.destroyed = true;
      this.agent?.close(reason);
    }
    await this.process.kill();
    const state = this.state;
    this.state = this.base = null;
    state?.release();
  }

  logTail(lines = 30): Promise<string> {
    return this.process.logTail(lines);
  }

  private reportDeath(why: string): void {
    if (this.destroyed || this.deathReported) return;
    this.deathReported = true;
    this.deathListener?.(why);
  }

  private async connectAgent(deadline: number): Promise<void> {
    const { paths } = this.process;
    const agent = await AgentChannel.connect(paths.agentSocket, paths.replSocket, deadline);
    this.agent = agent;
    agent.on('close', () => {
      if (this.destroyed || this.process.exited) return;
      // A dying QEMU closes the socket a moment before its exit is seen: wait for that, so
      // the reason says what happened.
      const lost = setTimeout(() => this.reportDeath('the guest agent connection was lost'), 500);
      void this.process.whenExited().then(() => clearTimeout(lost));
    });
  }

  private requireAgent(): AgentChannel {
    if (!this.agent) throw new VmError('VM has no agent connection');
    return this.agent;
  }
}
