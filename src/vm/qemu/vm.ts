/**
 * A machine (vm/machine.ts) made of one QEMU process and the guest agent's channel.
 *
 * Life cycle: a template VM is cold-booted once per template (`Vm.bootTemplate`) and frozen
 * into a `QemuState` (its RAM file + device state). Every sandbox VM is a restore of a state: a
 * QEMU started on the state's RAM file (`Vm.incoming`, a copy-on-write mapping, so it costs only
 * the pages it writes) that is then fed the device state (`resume`). A fork captures a running
 * VM into a new state (`capture`) and restores its children from it.
 */
import { readFileSync, statSync } from 'node:fs';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentChannel } from '../channels/agent-channel.js';
import { NO_EGRESS } from '../channels/egress-gate.js';
import { FileChannel } from '../channels/file-channel.js';
import { ProcChannel, ProcChannelError } from '../channels/proc-channel.js';
import type {
  CancelReason,
  ContextAnswer,
  ContextRequest,
  ExecSink,
  ExecSpec,
  ForkTarget,
  GuestFiles,
  GuestProcesses,
  Machine,
  MachineDescriptor,
  MachineUsage,
  NetworkPolicy,
  RunTurn,
} from '../machine.js';
import {
  NetChannel,
  type NetStats,
  type NetSyncResult,
  type QuietRelay,
} from '../channels/net-channel.js';
import { STATE_FORMAT } from '../storage/state-format.js';
import { MemImage } from '../storage/mem-image.js';
import { copyWrittenPages, loadWrittenPages, saveWrittenPages } from '../storage/page-delta.js';
import type { MachineSpec } from './qemu-args.js';
import { whileStopped } from './pause-window.js';
import { QemuProcess, type QemuHost } from './qemu-process.js';
import type { QemuState } from './qemu-state.js';
import type { StateStore } from './state-store.js';
import { connectWithRetry } from '../channels/unix-socket.js';
import type { QemuPaused } from './qemu-paused.js';
import { VmDisk, type PendingOverlay } from './vm-disk.js';
import { VmError } from '../vm-error.js';
import { asVmError } from './as-vm-error.js';

/** What every VM of one hypervisor shares: where QEMU runs, where states live. */
export interface VmContext {
  readonly host: QemuHost;
  readonly store: StateStore;
}

/** Timeouts, generous for TCG on a loaded 2-core machine. */
const BOOT_TIMEOUT_MS = 120_000;
const RESTORE_TIMEOUT_MS = 30_000;
const HELLO_TIMEOUT_MS = 30_000;
const WARM_UP_TIMEOUT_MS = 30_000;
/** A template's preloads (pandas, matplotlib) import for minutes under TCG before it freezes. */
const PREPARE_FREEZE_TIMEOUT_MS = 15 * 60_000;
/** How long a pause waits for the guest to drop its cache of written files; then it goes on. */
const PREPARE_PAUSE_TIMEOUT_MS = 5_000;
/** Ending a crashed hostd's execs: a cancel's escalation takes 2 s, a kill a moment more. */
const CANCEL_ALL_TIMEOUT_MS = 30_000;
const SET_ENV_TIMEOUT_MS = 30_000;
const NET_SYNC_TIMEOUT_MS = 30_000;
/**
 * A context request waits for the worker: one that just died starts afresh first, importing
 * the template's preloads (tens of seconds under TCG on a loaded host).
 */
const CONTEXT_TIMEOUT_MS = 120_000;
/**
 * Frozen disk layers a VM's overlay may sit on before a capture merges them into one: each
 * capture (fork, snapshot) adds one under the capturing VM, and every layer is a file each VM
 * restored from it opens, with its own cache, and a lookup on reads that miss the layers above.
 */
const MAX_DISK_CHAIN = 8;

/** A copy of a VM's base image made ahead, with incoming QEMUs on it (vm/qemu/fork-target.ts). */
export interface PreparedCopy {
  /** The copy, renamed to `path` (a fresh fork image name), and its incoming QEMUs. */
  take(path: string): Promise<Vm[]>;
}

function isPreparedCopy(target: unknown): target is PreparedCopy {
  return typeof (target as PreparedCopy | null)?.take === 'function';
}

const PAGE_BYTES = 4096;
const MIB = 1024 * 1024;

/**
 * QEMU's anonymous resident memory in MiB, from /proc/PID/statm (resident minus shared pages):
 * the guest pages it wrote (a private copy of its state's file), the TCG translation buffer and
 * QEMU's heap. Pages still read from the state's RAM file are shared with every other copy and
 * left out. statm is O(1) for the kernel, unlike smaps_rollup, which walks every mapping.
 */
function anonymousResidentMib(pid: number): number | null {
  try {
    const [, resident, shared] = readFileSync(`/proc/${pid}/statm`, 'utf8').split(' ').map(Number);
    if (resident === undefined || shared === undefined) return null;
    return Math.round((((resident - shared) * PAGE_BYTES) / MIB) * 10) / 10;
  } catch {
    return null;
  }
}

export class Vm implements Machine {
  private agent: AgentChannel | null = null;
  private filesChannel: FileChannel | null = null;
  private procChannel: ProcChannel | null = null;
  private net: NetChannel | null = null;
  /** What the latest hello said of the guest's network relay, until a network sync uses it. */
  private quietRelay: QuietRelay | null = null;
  /** The image this VM's RAM is a private copy-on-write mapping of (null for a template). */
  private base: MemImage | null = null;
  private state: QemuState | null = null;
  /** Its writable disk (null when the template has none: files then live in guest RAM). */
  private disk: VmDisk | null = null;
  private destroyed = false;
  /** Why the machine was given up while QEMU still ran (see `lose`). */
  private lostReason: string | null = null;
  private deathListener: ((why: string) => void) | null = null;
  private deathReported = false;

  private constructor(
    private readonly ctx: VmContext,
    readonly process: QemuProcess,
    readonly spec: MachineSpec,
  ) {
    process.once('exit', (info: string) => {
      this.closeChannels();
      this.reportDeath(`the VM exited (${info})`);
    });
  }

  get id(): string {
    return this.process.id;
  }

  get origin(): QemuState | null {
    return this.state;
  }

  /**
   * Cold-boots a template VM whose RAM is the shared file `memPath`, waits for its agent. Its
   * writable disk is a new overlay at `diskPath` over the template's empty disk: once the VM is
   * frozen, that file is the template's disk layer.
   */
  static async bootTemplate(
    ctx: VmContext,
    spec: MachineSpec,
    memPath: string,
    diskPath: string,
  ): Promise<Vm> {
    const deadline = Date.now() + BOOT_TIMEOUT_MS;
    const ram = { kind: 'template', memPath } as const;
    const base = spec.image.disk;
    if (base) await ctx.store.disks.newOverlay(base, diskPath);
    const disk = base ? { top: diskPath, layers: [base] } : undefined;
    const vm = new Vm(ctx, await QemuProcess.start(ctx.host, spec, ram, deadline, disk), spec);
    try {
      await vm.connectChannels(deadline);
      await vm.hello(BOOT_TIMEOUT_MS, false);
      return vm;
    } catch (err) {
      throw await vm.failed(err);
    }
  }

  /**
   * Starts an incoming QEMU (QEMU's own word, for a process started with `-incoming defer`):
   * on the RAM file `memPath`, waiting for a device state, with its agent socket connected. Such a QEMU has not touched guest RAM yet, so it resumes with
   * whatever the file holds by then: a fork can start its children's QEMUs before it has
   * written the parent's pages (core's fork standby starts them before the fork is asked for).
   */
  static async incoming(
    ctx: VmContext,
    spec: MachineSpec,
    memPath: string,
    disk: VmDisk | null,
  ): Promise<Vm> {
    const deadline = Date.now() + RESTORE_TIMEOUT_MS;
    const ram = { kind: 'clone', memPath } as const;
    let process: QemuProcess;
    try {
      process = await QemuProcess.start(ctx.host, spec, ram, deadline, disk?.chain());
    } catch (err) {
      await disk?.release();
      throw err;
    }
    const vm = new Vm(ctx, process, spec);
    vm.disk = disk;
    try {
      // Connected before the device state loads, the agent port is "host connected" on both
      // sides of the restore, as it was when the snapshot was taken. Connecting after `cont`
      // flipped it closed then open: the guest agent saw EOF, slept, and the first restore
      // work the guest did was noise (~20-50 ms under TCG).
      await vm.connectChannels(deadline);
      return vm;
    } catch (err) {
      throw await vm.failed(err);
    }
  }

  /**
   * A running machine in `state`: one of the incoming QEMUs on its image when there is one, else
   * a new one. Holds a reference to the state's image from before QEMU opens the file, so that
   * the image cannot be deleted under it.
   */
  static async restore(ctx: VmContext, state: QemuState, turn?: RunTurn): Promise<Vm> {
    state.retain();
    let vm: Vm | undefined;
    try {
      while ((vm = state.incoming.pop()) && !vm.isIncoming) void vm.destroy();
      vm ??= await Vm.incoming(ctx, state.spec, state.image.path, await Vm.newDisk(ctx, state));
    } catch (err) {
      state.release();
      throw err;
    }
    await vm.resume(state, state.deviceState, true, turn);
    return vm;
  }

  /** A new writable disk over `state`'s layer; null when the template has no disk. */
  private static async newDisk(ctx: VmContext, state: QemuState): Promise<VmDisk | null> {
    const base = state.spec.image.disk;
    if (!base) return null;
    return VmDisk.create(ctx.store.disks, base, state.layer?.retain() ?? null);
  }

  /**
   * A writable disk with no layer yet, for an incoming QEMU of `spec`: it gets the layer of the
   * state it is restored into. Null when the template has no disk.
   */
  static async unattachedDisk(ctx: VmContext, spec: MachineSpec): Promise<VmDisk | null> {
    const base = spec.image.disk;
    return base ? VmDisk.unattached(ctx.store.disks, base) : null;
  }

  /**
   * Takes over the running QEMU `desc` names, restored from `state`, after a hostd crash: QMP and
   * the agent's ports are reconnected, the agent re-synchronised (hello), and whatever the guest
   * was running is cancelled: its clients went with the old hostd.
   */
  static async adopt(ctx: VmContext, desc: MachineDescriptor, state: QemuState): Promise<Vm> {
    const deadline = Date.now() + RESTORE_TIMEOUT_MS;
    const process = await QemuProcess.attach(ctx.host, desc.id, desc.pid, deadline);
    const vm = new Vm(ctx, process, state.spec);
    vm.state = state.retain();
    vm.base = state.image;
    try {
      const base = state.spec.image.disk;
      if (desc.disk !== undefined && base) {
        vm.disk = await VmDisk.adopt(ctx.store.disks, base, desc.disk, process.qmp);
      }
      await vm.connectChannels(deadline);
      const agent = vm.requireAgent();
      await vm.hello(HELLO_TIMEOUT_MS, false);
      // Nothing may be sent before the answer: a bash exit that follows it is a new exec's.
      await agent.request('cancel_all', {}, CANCEL_ALL_TIMEOUT_MS);
      return vm;
    } catch (err) {
      throw await vm.failed(err);
    }
  }

  /**
   * CPU time and resident memory of its QEMU from /proc (Linux's USER_HZ is 100 and its
   * statm counts 4 KiB pages on x86-64), and its disk's allocated bytes.
   */
  /**
   * Read synchronously: /proc/PID/stat and statm are O(1) for the kernel and a stat of the disk's
   * files is a cached inode, ~20 µs together, where `fs.promises` took ~200 µs of hostd's CPU
   * per sandbox in thread-pool round trips, all at once for every sandbox on each 5 s mark
   * (docs/architecture.md, "Exec latency on a slow TCG host").
   */
  usage(): MachineUsage {
    const pid = this.process.pid;
    if (pid === undefined || this.destroyed) throw new VmError('died', 'the VM is not running');
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const statm = readFileSync(`/proc/${pid}/statm`, 'utf8');
    const diskBytes = this.disk?.allocatedBytes() ?? 0;
    // Fields after the command name, which may hold spaces: utime and stime are the 12th and 13th.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]);
    const resident = Number(statm.split(' ')[1]);
    return { cpuSeconds: ticks / 100, memoryBytes: resident * 4096, diskBytes };
  }

  describe(): MachineDescriptor {
    const { state } = this;
    const pid = this.process.pid;
    if (!state || pid === undefined) {
      throw new VmError('unsupported', 'only a running clone can be described');
    }
    return {
      format: STATE_FORMAT,
      id: this.id,
      pid,
      origin: { format: STATE_FORMAT, id: state.id, spec: state.spec },
      ...(this.disk ? { disk: this.disk.topId } : {}),
    };
  }

  /**
   * Readies this incoming VM for a fork of a machine restored from `base` (a fork standby's QEMU,
   * vm/qemu/fork-target.ts), before the fork is asked for: opens `base`'s disk layers, under
   * which the fork's layer will go (VmDisk.preopen), and has QEMU listen for its device state.
   * Both are steps each child's restore would otherwise take in the fork, where the children
   * compete for the host's cores. On failure the VM is destroyed.
   */
  async readyForFork(base: QemuState): Promise<void> {
    try {
      await this.disk?.preopen(this.process, base.layer);
      await this.process.listenForState();
    } catch (err) {
      throw await this.failed(err);
    }
  }

  /** True while this VM (made by `incoming`) waits, alive and unused, for a device state. */
  get isIncoming(): boolean {
    return this.state === null && this.alive;
  }

  /**
   * Loads a device state of `state` into this incoming VM, runs it, and waits for hello. `copy`:
   * `state` itself (a new copy), not a pause of one machine (which goes on). `turn`: awaited
   * once the disk is attached, before the device state goes (QEMU runs the guest as soon as it
   * has loaded it); the restore's timeout starts with the turn.
   */
  private async resume(
    state: QemuState,
    deviceState: Buffer,
    copy: boolean,
    turn?: RunTurn,
  ): Promise<void> {
    this.state = state; // takes over the caller's reference
    this.base = state.image;
    try {
      if (this.disk && !this.disk.isAttached) {
        await this.disk.attach(this.process, state.layer?.retain() ?? null);
      }
      await turn?.();
      await this.process.loadDeviceState(deviceState, Date.now() + RESTORE_TIMEOUT_MS);
      await this.hello(HELLO_TIMEOUT_MS, copy);
    } catch (err) {
      const error = await this.failed(err);
      // The caller's reference was handed over above, and nothing destroys this VM now (no one
      // holds it): let go once QEMU is gone, or the state's image (a fork point's RAM file on
      // tmpfs) outlives every user until hostd's next start. Each fork child that fails or
      // gives up its turn (core/lineage.ts) comes here.
      this.state = this.base = null;
      state.release();
      throw error;
    }
  }

  get alive(): boolean {
    return (
      !this.process.exited &&
      !this.destroyed &&
      this.lostReason === null &&
      this.agent !== null &&
      !this.agent.closed
    );
  }

  get deathReason(): string {
    if (this.lostReason !== null) return this.lostReason;
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

  ping(timeoutMs: number): Promise<boolean> {
    return this.agent?.ping(timeoutMs) ?? Promise.resolve(false);
  }

  contexts(request: ContextRequest): Promise<ContextAnswer> {
    return this.requireAgent().context(request, CONTEXT_TIMEOUT_MS);
  }

  pauseOutput(): void {
    this.agent?.pause();
  }

  resumeOutput(): void {
    this.agent?.resume();
  }

  /**
   * A restored VM is a new QEMU process whose TCG translation cache is empty: its first exec
   * took ~470 ms against ~25 ms for the next ones. Pool VMs pay that in the background. The
   * network port starts over here too (no ports, nothing allowed until the sandbox's rules
   * come): done at create, a sync ran beside the first exec and cost it ~75 ms. A clone of the
   * template's quiet relay usually needs no sync at all (syncNetwork).
   *
   * The exec is `print(1)`: the path every exec takes (the port, the cell's compile, its output,
   * its exit) and nothing more. Every guest block it translates stays in the VM's translation
   * buffer for the sandbox's life, whether the sandbox runs that code or not; the template's
   * preloads, re-imported here until issue 29, translated ~1,500 blocks (~0.8 MiB per VM) that
   * a first `import pandas as pd` cell needs ~350 of (docs/architecture.md, "Density").
   */
  warmUp(): Promise<void> {
    return asVmError(
      'warm_up',
      () => this.runWarmUp(),
      () => this.alive,
    );
  }

  private async runWarmUp(): Promise<void> {
    if (this.net) await this.syncNetwork(this.net, []);
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new VmError('agent_unresponsive', 'warm-up exec did not finish')),
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
            onLost: (reason) => done(new VmError('died', reason)),
          },
        );
      } catch (err) {
        done(err as Error);
      }
    });
  }

  /**
   * Runs a template's `warmup` (recipe) in this template VM before it is frozen: the first use
   * of its libraries (a figure rendered, a DataFrame grouped) then happens once, in the
   * template, and every sandbox inherits its effects (font and path caches, loaded backends,
   * lazily imported modules). It runs in a scratch namespace, so `__main__` stays as clean as
   * the preloads left it. An exception fails the template's boot with the exception's last line.
   */
  async runWarmup(code: string): Promise<void> {
    const wrapped = `exec(compile(${JSON.stringify(code)}, "<template warmup>", "exec"), {"__name__": "__warmup__"})`;
    let stderr = '';
    const exit = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new VmError('agent_unresponsive', 'the template warmup did not finish')),
        PREPARE_FREEZE_TIMEOUT_MS,
      );
      const done = (err: Error | null, code = 0): void => {
        clearTimeout(timer);
        if (err) reject(err);
        else resolve(code);
      };
      try {
        this.exec(
          { language: 'python', code: wrapped },
          {
            onOutput: (stream, data) => {
              if (stream === 'stderr') stderr = (stderr + data).slice(-4096);
            },
            onExit: (code) => done(null, code),
            onLost: (reason) => done(new VmError('died', reason)),
          },
        );
      } catch (err) {
        done(err as Error);
      }
    });
    if (exit !== 0) {
      const last = stderr.trim().split('\n').pop() ?? '';
      throw new VmError(
        'start_failed',
        `the template warmup failed (exit ${exit}): ${last.slice(0, 300)}`,
      );
    }
  }

  get files(): GuestFiles {
    if (!this.filesChannel) throw new VmError('died', 'VM has no files connection');
    return this.filesChannel;
  }

  get processes(): GuestProcesses {
    if (this.procChannel) return this.procChannel;
    if (this.spec.procPort) throw new VmError('died', 'VM has no processes connection');
    throw new ProcChannelError(
      'unavailable',
      'the sandbox was made by an earlier hostd, whose machines had no processes port',
    );
  }

  setNetwork(policy: NetworkPolicy): Promise<void> {
    return asVmError(
      'set_network',
      async () => {
        const net = this.net;
        if (!net) throw new VmError('died', 'VM has no network connection');
        net.gate = policy.gate;
        const answer = await this.syncNetwork(net, policy.hostPorts);
        if (answer.failed.length > 0) {
          const what = answer.failed.map((f) => `${f.port}: ${f.error}`).join(', ');
          const detail = `it could not listen on host.hostd.internal ports (${what})`;
          throw new VmError('guest_refused', detail, { guestDetail: detail });
        }
      },
      () => this.alive,
    );
  }

  /** Greets the agent (AgentChannel.hello), keeping what it says of its network relay. */
  private async hello(timeoutMs: number, copy: boolean): Promise<void> {
    this.quietRelay = (await this.requireAgent().hello(timeoutMs, copy)).quietRelay;
  }

  /**
   * Starts the network port over for `ports`: a sync round trip, unless the guest's relay
   * said at the latest hello that it holds nothing (a restored copy of a quiet VM) and the
   * port can be taken as it is.
   */
  private async syncNetwork(net: NetChannel, ports: readonly number[]): Promise<NetSyncResult> {
    const relay = this.quietRelay;
    this.quietRelay = null;
    return net.acceptQuiet(ports, relay) ?? (await net.sync(ports, NET_SYNC_TIMEOUT_MS));
  }

  networkStats(): NetStats {
    return this.net?.stats ?? { bytesOut: 0, bytesIn: 0, openConnections: 0, waitingOnGuest: 0 };
  }

  ownMemoryMib(): number | null {
    const pid = this.process.pid;
    return pid === undefined || this.destroyed ? null : anonymousResidentMib(pid);
  }

  setEnv(env: Readonly<Record<string, string>>): Promise<void> {
    return asVmError(
      'set_env',
      async () => {
        const answer = await this.requireAgent().request('set_env', { env }, SET_ENV_TIMEOUT_MS);
        if (typeof answer.error === 'string') {
          throw new VmError('guest_refused', `set_env: ${answer.error}`, {
            guestDetail: answer.error,
          });
        }
      },
      () => this.alive,
    );
  }

  /**
   * Freezes this template VM: the guest first finishes its preloads and zeroes its free memory
   * (zero pages become holes in the image, which forks never copy); its RAM already lives in its
   * shared RAM file, so only the device state is saved; the VM is then destroyed so that the
   * file never changes again. Returns that device state.
   */
  async freeze(log: (fields: Record<string, unknown>) => void = () => undefined): Promise<Buffer> {
    const prepared = await this.requireAgent().request(
      'prepare_freeze',
      {},
      PREPARE_FREEZE_TIMEOUT_MS,
    );
    log({ zeroedBytes: prepared.zeroed_bytes, error: prepared.error });
    await this.process.qmp.execute('stop');
    const deviceState = await this.process.saveDeviceState();
    await this.destroy();
    return deviceState;
  }

  /**
   * Captures this clone's whole state as a new QemuState whose RAM image is a copy of its base
   * image (made while the guest runs, or taken ready-made from `target`) plus the pages it has
   * written (copied while it is paused, together with the device state). The guest is paused for
   * milliseconds. The state comes with `target`'s incoming QEMUs (maybe more or fewer than
   * `children`); `restore` uses them first and the caller destroys the rest.
   */
  capture(children: number, target: ForkTarget | null): Promise<QemuState> {
    void children; // the incoming QEMUs were sized by core's fork standby policy
    return asVmError(
      'capture',
      () => this.captureState(target),
      () => this.alive,
    );
  }

  private async captureState(target: ForkTarget | null): Promise<QemuState> {
    const { base } = this;
    const pid = this.process.pid;
    if (!base || pid === undefined) {
      throw new VmError('unsupported', 'only a running clone can be captured');
    }
    // For the next capture or pause on this base (a fork point learns its holes on first use).
    base.learnZeroPages();
    if (target && !isPreparedCopy(target)) {
      throw new VmError('unsupported', 'a fork target of another hypervisor');
    }
    const { store, host } = this.ctx;
    const path = store.newImagePath('fork');
    // Expected: a target whose copy cannot be renamed (its incoming QEMUs are then destroyed by
    // `take`). Only a lost speed-up: the base is copied here instead, as without a target.
    let incoming = target ? await target.take(path).catch(() => null) : null;
    if (!incoming) {
      incoming = [];
      await MemImage.copy(base.path, path, host.jail?.group);
    }
    let overlay: PendingOverlay | null = null;
    try {
      // Made while the guest runs; only putting it over the current overlay needs the pause.
      overlay = this.disk ? await this.disk.prepareCapture(this.process) : null;
      const pending = overlay;
      // What the new image holds over its base: a snapshot of it syncs only that (StateDelta).
      const runs: Array<[number, number]> = [];
      const deviceState = await whileStopped(this.runState(), 'always', async () => {
        const saved = await this.process.saveDeviceState();
        const ram = this.spec.memoryMib * 1024 * 1024;
        await copyWrittenPages(pid, base.path, ram, path, base.zeroPages, runs);
        // `stop` drained and flushed the disk: the overlay now is the disk of this instant.
        await pending?.stack();
        return saved;
      });
      let layer = overlay ? await overlay.commit() : null;
      if (this.disk && this.disk.depth > MAX_DISK_CHAIN) {
        // Expected: a flattening that fails (disk space, QEMU refusing the reopen) keeps the
        // old chain (VmDisk.flatten); only a cost, never a failure: it is just as correct.
        layer = (await this.disk.flatten(this.process).catch(() => null)) ?? layer;
      }
      const origin = this.state ? { base: this.state, runs } : null;
      return (await store.addFork(path, this.spec, deviceState, layer, incoming, origin)).retain();
    } catch (err) {
      await overlay?.abandon();
      for (const vm of incoming) void vm.destroy();
      await rm(path, { force: true });
      throw err;
    }
  }

  /**
   * A paused machine running again: a new QEMU on its origin's image (not a fork standby: those
   * wait on a copy of a template's image that the next fork turns into its own), the saved pages
   * written into its RAM before the guest runs, then its device state. The paused files stay
   * until the caller discards them.
   */
  static async resumePaused(ctx: VmContext, paused: QemuPaused): Promise<Vm> {
    const state = paused.origin.retain();
    let vm: Vm;
    try {
      const { disk } = paused;
      const base = state.spec.image.disk;
      const vmDisk =
        disk && base
          ? await VmDisk.fromPaused(ctx.store.disks, base, disk.path, disk.layer?.retain() ?? null)
          : null;
      vm = await Vm.incoming(ctx, state.spec, state.image.path, vmDisk);
    } catch (err) {
      state.release();
      throw err;
    }
    try {
      const pid = vm.process.pid;
      if (pid === undefined) throw new VmError('start_failed', 'QEMU has no pid');
      const bytes = state.spec.memoryMib * 1024 * 1024;
      await loadWrittenPages(pid, state.image.path, bytes, paused.deltaPath);
    } catch (err) {
      state.release();
      throw await vm.failed(err);
    }
    await vm.resume(state, paused.deviceState, false);
    return vm;
  }

  pause(): Promise<QemuPaused> {
    return asVmError(
      'pause',
      () => this.writeToDisk(),
      () => this.alive,
    );
  }

  private async writeToDisk(): Promise<QemuPaused> {
    const { base, state } = this;
    const pid = this.process.pid;
    if (!base || !state || pid === undefined) {
      throw new VmError('unsupported', 'only a running clone can pause');
    }
    const { store } = this.ctx;
    const { id, dir } = await store.newPausedDir();
    // Learnt once per image, while the guest drops its caches (the walk takes tens of ms, the
    // drop hundreds), so that this pause's delta already skips the base's holes.
    base.learnZeroPages();
    await this.releaseWrittenFiles();
    await base.zeroPagesLearnt();
    // On failure the guest runs on as before (or, if QEMU will not run it again, the machine
    // is lost: whileStopped), and nothing is left on disk; past the window, see below.
    const { deviceState, bytes } = await whileStopped(this.runState(), 'on-failure', async () => {
      try {
        const saved = await this.process.saveDeviceState();
        const delta = join(dir, 'memory.delta');
        const ram = this.spec.memoryMib * 1024 * 1024;
        const written = await saveWrittenPages(pid, base.path, ram, delta, base.zeroPages);
        await writeFile(join(dir, 'device.state'), saved, { mode: 0o640 });
        if (this.disk) await store.disks.recordPaused(dir, this.disk.layer);
        return { deviceState: saved, bytes: written };
      } catch (err) {
        await rm(dir, { recursive: true, force: true });
        throw err;
      }
    });
    let disk: QemuPaused['disk'] = null;
    try {
      // The stopped VM's overlay moves, whole, into the paused folder, with its layer's reference.
      disk = this.disk ? await this.disk.moveToPaused(dir) : null;
      // Durable before the sandbox's record says it is paused (docs/api.md): the folder, whole,
      // its origin (a fork point is not synced when made) and its disk's layers, in one batch
      // of syncs once every file is in place: each more batch cost ext4 a journal commit, 0.1
      // to 0.5 s on a host with much dirty data (docs/architecture.md, "Measured choices").
      await store.persistPaused(
        store.pausedFiles(dir, disk !== null),
        [store.pausedDir],
        state,
        disk?.layer ?? null,
      );
    } catch (err) {
      // The guest cannot run again without its overlay (the sync failing is the host's disk
      // failing): the machine is lost, never a sandbox that reads ready with a stopped guest.
      this.lose('the sandbox could not be written to disk');
      disk?.layer?.release();
      await rm(dir, { recursive: true, force: true });
      throw err;
    }
    // The paused machine takes its own reference to the origin; this VM's goes with it.
    const paused = store.addPaused(
      id,
      dir,
      state.retain(),
      deviceState,
      bytes + deviceState.length,
      disk,
    );
    await this.destroy('the sandbox was paused');
    return paused;
  }

  /**
   * Has the guest write back and drop its cache of the files it wrote (PROTOCOL.md,
   * prepare_pause): pages a pause would otherwise save and a resume load back, though their
   * bytes are on the VM's disk already. Only a cost saved, so a guest that does not answer in
   * time, or fails, is paused as it is.
   */
  private async releaseWrittenFiles(): Promise<void> {
    const agent = this.agent;
    if (!agent?.servesPreparePause) return;
    // Expected: a guest busy past the timeout, or one that refuses. A dead one is not: it
    // fails the pause's next step (`stop`) with the death as its reason.
    await agent.request('prepare_pause', {}, PREPARE_PAUSE_TIMEOUT_MS).catch(() => undefined);
  }

  /** QEMU's `stop` and `cont` for a pause window, and what losing the machine does. */
  private runState(): Parameters<typeof whileStopped>[0] {
    const qmp = this.process.qmp;
    return {
      stop: async () => void (await qmp.execute('stop')),
      cont: async () => void (await qmp.execute('cont')),
      lose: (why) => this.lose(why),
    };
  }

  /**
   * Gives the machine up while QEMU still runs (its guest cannot run again): it is killed and
   * its death reported, so that its sandbox fails at once instead of hanging on a stopped guest.
   */
  private lose(why: string): void {
    if (this.lostReason !== null || this.destroyed) return;
    this.lostReason = why;
    this.reportDeath(why);
    void this.process.kill();
  }

  captureCostMib(): number {
    if (!this.base) return 0;
    try {
      return (statSync(this.base.path).blocks * 512) / 1024 / 1024;
    } catch {
      // Expected: the base image of a machine being destroyed is gone; an estimate of 0 lets
      // the capture itself fail with the reason.
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
      this.closeChannels(reason);
    }
    await this.process.kill();
    const state = this.state;
    this.state = this.base = null;
    state?.release();
    await this.disk?.release();
  }

  logTail(lines = 30): Promise<string> {
    return this.process.logTail(lines);
  }

  private reportDeath(why: string): void {
    if (this.destroyed || this.deathReported) return;
    this.deathReported = true;
    this.deathListener?.(why);
  }

  /** Kills QEMU and frees its disk after `err` made the VM unusable; returns the VmError. */
  private async failed(err: unknown): Promise<VmError> {
    const error = await this.process.failed(err);
    await this.disk?.release();
    return error;
  }

  /**
   * Connects all the guest's ports (five with the processes port). Before a restore, so that every port is "host
   * connected" on both sides of it, as when the state was saved (see `incoming`).
   */
  private async connectChannels(deadline: number): Promise<void> {
    const { paths } = this.process;
    const agent = await AgentChannel.connect(paths.agentSocket, paths.replSocket, deadline);
    this.agent = agent;
    this.filesChannel = new FileChannel(await connectWithRetry(paths.filesSocket, deadline));
    if (this.spec.procPort && paths.procSocket) {
      this.procChannel = new ProcChannel(await connectWithRetry(paths.procSocket, deadline));
    }
    // Until setNetwork, the channel ignores the guest and the gate refuses everything.
    this.net = new NetChannel(await connectWithRetry(paths.netSocket, deadline), {
      gate: NO_EGRESS,
    });
    agent.on('close', () => {
      if (this.destroyed || this.process.exited) return;
      // A dying QEMU closes the socket a moment before its exit is seen: wait for that, so
      // the reason says what happened.
      const lost = setTimeout(() => this.reportDeath('the guest agent connection was lost'), 500);
      void this.process.whenExited().then(() => clearTimeout(lost));
    });
  }

  private closeChannels(reason?: string): void {
    this.agent?.close(reason);
    this.filesChannel?.close(reason);
    this.procChannel?.close(reason);
    this.net?.close(reason);
  }

  private requireAgent(): AgentChannel {
    if (!this.agent) throw new VmError('died', 'VM has no agent connection');
    return this.agent;
  }
}
