/**
 * One QEMU microVM process and its two channels (QMP, guest agent).
 *
 * Life cycle: a template VM is cold-booted once per template (`Vm.bootTemplate`) and frozen
 * into a `Snapshot` (its RAM file + device state). Every sandbox VM is `Vm.restore`d from a
 * snapshot: a copy-on-write mapping of the RAM file, so it starts in ~100 ms instead of
 * seconds and costs only the pages it writes. Forking a running VM first turns its current
 * state into a new snapshot (`Vm.snapshot`), then restores children from it.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { statSync } from 'node:fs';
import { chown, mkdir, open, rm } from 'node:fs/promises';
import { promisify } from 'node:util';
import { join } from 'node:path';
import { EventEmitter } from 'node:events';
import { AgentChannel, type CancelReason, type ExecSink, type Language } from './agent-channel.js';
import { QmpClient } from './qmp.js';
import { qemuArgs, type MachineSpec, type RamMode, type VmPaths } from './qemu-args.js';
import { sendStream } from './migration.js';
import { copyImage, MemImage } from './mem-image.js';
import { copyWrittenPages } from './page-delta.js';
import { readBounded, readTail, truncateIfOver } from './safe-files.js';
import type { SpareCopies } from './spare-copies.js';

const run = promisify(execFile);

/** An immutable memory image plus the device state that goes with it. */
export interface Snapshot {
  readonly spec: MachineSpec;
  /** tmpfs file holding guest RAM; never written after the snapshot is taken. The snapshot
   * owns one reference; whoever holds the snapshot releases it when done restoring. */
  readonly image: MemImage;
  /** QEMU device state without RAM (xen-save-devices-state): about 8 KB. */
  readonly deviceState: Buffer;
  /** QEMUs started on `image` and waiting for this device state; `restore` takes them first. */
  readonly standby?: Vm[];
}

export interface VmHost {
  readonly qemuBinary: string;
  /** Directory under which each VM gets its own folder of sockets and logs. */
  readonly vmsDir: string;
  /** Extra argv put before QEMU (e.g. setpriv dropping privileges); always includes pdeathsig. */
  readonly launcher: readonly string[];
  /** When QEMU runs as another user: that user owns each VM's directory and its RAM images. */
  readonly owner?: { uid: number; gid: number };
  /** Ready-made copies of template images, which spare forks the copy of their base. */
  readonly spares?: SpareCopies;
}

/** Raised for anything that makes a VM unusable: QEMU failed, died, or the agent is silent. */
export class VmError extends Error {
  constructor(
    message: string,
    readonly consoleTail = '',
  ) {
    super(message);
    this.name = 'VmError';
  }
}

let vmCounter = 0;

/** Timeouts, generous for TCG on a loaded 2-core machine. */
const BOOT_TIMEOUT_MS = 120_000;
const RESTORE_TIMEOUT_MS = 30_000;
const HELLO_TIMEOUT_MS = 30_000;

export class Vm extends EventEmitter {
  readonly id: string;
  readonly dir: string;
  readonly paths: VmPaths;
  private proc: ChildProcess | null = null;
  qmp: QmpClient | null = null;
  private agent: AgentChannel | null = null;
  /** The image this VM's RAM is a private copy-on-write mapping of (null for a template). */
  private base: MemImage | null = null;
  private exited = false;
  private consoleCap: NodeJS.Timeout | undefined;
  private exitInfo = '';
  private destroyed = false;
  private readonly exitPromise: Promise<void>;
  private resolveExit!: () => void;

  private constructor(
    readonly host: VmHost,
    readonly spec: MachineSpec,
  ) {
    super();
    this.id = `vm${process.pid.toString(36)}-${(++vmCounter).toString(36)}`;
    this.dir = join(host.vmsDir, this.id);
    this.paths = {
      qmpSocket: join(this.dir, 'qmp.sock'),
      agentSocket: join(this.dir, 'agent.sock'),
      replSocket: join(this.dir, 'repl.sock'),
      consoleLog: join(this.dir, 'console.log'),
    };
    this.exitPromise = new Promise((r) => (this.resolveExit = r));
  }

  /** Cold-boots a template VM whose RAM is the shared file `memPath`, waits for its agent. */
  static async bootTemplate(host: VmHost, spec: MachineSpec, memPath: string): Promise<Vm> {
    const vm = new Vm(host, spec);
    try {
      await vm.start({ kind: 'template', memPath }, Date.now() + BOOT_TIMEOUT_MS);
      await vm.connectAgent(Date.now() + BOOT_TIMEOUT_MS);
      await vm.requireAgent().hello(BOOT_TIMEOUT_MS);
      return vm;
    } catch (err) {
      throw await vm.failStart(err);
    }
  }

  /**
   * Starts a copy-on-write clone of `snapshot` and waits until its agent answers. Uses a QEMU
   * already waiting on the snapshot's image (`snapshot.standby`) when there is one.
   */
  static async restore(host: VmHost, snapshot: Snapshot): Promise<Vm> {
    // Held from before QEMU opens the file, so that the image cannot be deleted under it.
    const image = snapshot.image.retain();
    let vm: Vm | undefined;
    try {
      while ((vm = snapshot.standby?.pop()) && !vm.standingBy) void vm.destroy();
      vm ??= await Vm.standby(host, snapshot.spec, snapshot.image.path);
    } catch (err) {
      image.release();
      throw err;
    }
    await vm.resume(snapshot, image);
    return vm;
  }

  /**
   * Starts QEMU on the RAM file `memPath` waiting for a device state (`-incoming defer`), with
   * its agent socket connected. Such a QEMU has not touched guest RAM yet, so it resumes with
   * whatever the file holds by then: a fork can start its children's QEMUs before it has
   * written the parent's pages (vm/spare-copies.ts starts them before the fork is asked for).
   */
  static async standby(host: VmHost, spec: MachineSpec, memPath: string): Promise<Vm> {
    const vm = new Vm(host, spec);
    try {
      const deadline = Date.now() + RESTORE_TIMEOUT_MS;
      await vm.start({ kind: 'clone', memPath }, deadline);
      // Connected before the device state loads, the agent port is "host connected" on both
      // sides of the restore, as it was when the snapshot was taken. Connecting after `cont`
      // flipped it closed then open: the guest agent saw EOF, slept, and the first restore
      // work the guest did was noise (~20-50 ms under TCG).
      await vm.connectAgent(deadline);
      return vm;
    } catch (err) {
      throw await vm.failStart(err);
    }
  }

  /**
   * True while this VM (made by `Vm.standby`) waits, alive and unused, for a device state: it
   * gets a base image only when resumed.
   */
  get standingBy(): boolean {
    return this.base === null && this.alive;
  }

  /**
   * Loads `snapshot`'s device state into this standby VM, runs it, and waits for hello. Takes
   * over `image`, a reference to the snapshot's image.
   */
  private async resume(snapshot: Snapshot, image: MemImage): Promise<void> {
    this.base = image;
    try {
      const deadline = Date.now() + RESTORE_TIMEOUT_MS;
      await this.incoming(snapshot.deviceState, deadline);
      await this.requireAgent().hello(HELLO_TIMEOUT_MS);
    } catch (err) {
      throw await this.failStart(err);
    }
  }

  /** The guest agent channel; exec and cancel go through it. */
  exec(language: Language, code: string, sink: ExecSink): number {
    return this.requireAgent().exec(language, code, sink);
  }

  /**
   * Runs one trivial Python exec and waits for it. A restored VM is a new QEMU process whose
   * TCG translation cache is empty: its first exec took ~470 ms against ~25 ms for the next
   * ones. Pool VMs pay that in the background, before anyone waits on them.
   */
  warmUp(timeoutMs = 30_000): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new VmError('warm-up exec did not finish')), timeoutMs);
      const done = (err?: Error): void => {
        clearTimeout(timer);
        if (err) reject(err);
        else resolve();
      };
      try {
        this.exec('python', 'print(1)', {
          onOutput: () => undefined,
          onExit: () => done(),
          onLost: (reason) => done(new VmError(reason)),
        });
      } catch (err) {
        done(err as Error);
      }
    });
  }

  cancel(execId: number, reason: CancelReason): void {
    this.agent?.cancel(execId, reason);
  }

  /** Stop/resume reading guest output (backpressure from a slow HTTP client). */
  pauseOutput(): void {
    this.agent?.pause();
  }

  resumeOutput(): void {
    this.agent?.resume();
  }

  get alive(): boolean {
    return !this.exited && !this.destroyed && this.agent !== null && !this.agent.closed;
  }

  /** Why the VM is not alive, for error messages. */
  get deathReason(): string {
    if (this.exited) return `the VM exited (${this.exitInfo})`;
    if (this.agent?.closed) return 'the guest agent connection was lost';
    return 'the VM is not running';
  }

  /**
   * Freezes this template VM: its RAM already lives in the shared file `memPath`, so only the
   * device state is saved; the VM is then destroyed so that the file never changes again.
   * Zero pages are turned into holes, which halves the file on a fresh guest.
   */
  async freezeAsTemplate(memPath: string): Promise<Snapshot> {
    await this.requireQmp().execute('stop');
    const deviceState = await this.saveDeviceState();
    await this.destroy();
    await run('fallocate', ['--dig-holes', memPath]);
    return { spec: this.spec, image: new MemImage(memPath).retain(), deviceState };
  }

  /**
   * Captures this clone's whole state as a new snapshot whose RAM image is `memPath`: a copy of
   * its base image (made while the guest runs) plus the pages it has written (copied while it
   * is paused, together with the device state). The guest is paused for milliseconds.
   * `children` is how many VMs will be restored from it. When a ready copy of the base was
   * taken, the snapshot comes with the QEMUs already started on it (`standby`, as many as
   * waited: maybe more or fewer than `children`); the caller destroys those it does not use.
   */
  async snapshot(memPath: string, children = 1): Promise<Snapshot> {
    const qmp = this.requireQmp();
    const base = this.base;
    const pid = this.proc?.pid;
    if (!base || pid === undefined) throw new VmError('only a running clone can be snapshotted');
    const image = new MemImage(memPath).retain();
    let standby: Vm[] = [];
    try {
      const taken = await this.host.spares?.take(base.path, memPath, children);
      if (taken) {
        standby = taken;
      } else {
        await copyImage(base.path, memPath, this.host.owner);
      }
      await qmp.execute('stop');
      try {
        const deviceState = await this.saveDeviceState();
        await copyWrittenPages(pid, base.path, this.spec.memoryMib * 1024 * 1024, memPath);
        return { spec: this.spec, image, deviceState, standby };
      } finally {
        await qmp.execute('cont');
      }
    } catch (err) {
      for (const vm of standby) void vm.destroy();
      image.release();
      throw err;
    }
  }

  /**
   * Kills QEMU and removes every file of this VM. Safe to call more than once. A running exec
   * ends with `reason` as its executor error.
   */
  async destroy(reason = 'the VM was destroyed'): Promise<void> {
    if (this.destroyed) return this.exitPromise;
    this.destroyed = true;
    this.agent?.close(reason);
    this.qmp?.close();
    clearInterval(this.consoleCap);
    if (this.proc && !this.exited) this.proc.kill('SIGKILL');
    else this.resolveExit();
    await this.exitPromise;
    this.base?.release();
    this.base = null;
    await rm(this.dir, { recursive: true, force: true });
  }

  /** Last lines of the guest console (kernel and init messages) plus QEMU's stderr. */
  async logTail(lines = 30): Promise<string> {
    const read = async (p: string): Promise<string> =>
      (await readTail(p, 64 * 1024)).toString('utf8').split('\n').slice(-lines).join('\n');
    const [consoleTail, qemuTail] = await Promise.all([
      read(this.paths.consoleLog),
      read(join(this.dir, 'qemu.log')),
    ]);
    return `--- guest console (${this.id}) ---\n${consoleTail}\n--- qemu stderr ---\n${qemuTail}`;
  }

  /** Allocated size of this VM's base image in MiB: what a fork's copy of it will cost. */
  imageMib(): number {
    if (!this.base) return 0;
    try {
      return (statSync(this.base.path).blocks * 512) / 1024 / 1024;
    } catch {
      return 0;
    }
  }

  private async start(ram: RamMode, deadline: number): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    if (this.host.owner) await chown(this.dir, this.host.owner.uid, this.host.owner.gid);
    if (ram.kind === 'template' && this.host.owner) {
      // hostd creates the template's RAM file, so QEMU's account needs no right to create
      // files among the images (where it could plant links for hostd to follow).
      const fh = await open(ram.memPath, 'wx', 0o600);
      await fh.chown(this.host.owner.uid, this.host.owner.gid);
      await fh.close();
    }
    // A guest writing to its console without end must not fill host memory (tmpfs).
    this.consoleCap = setInterval(
      () => void truncateIfOver(this.paths.consoleLog, 1024 * 1024),
      10_000,
    );
    this.consoleCap.unref();
    const log = await open(join(this.dir, 'qemu.log'), 'w');
    const args = qemuArgs(this.spec, this.paths, ram);
    const [cmd, ...pre] = [...this.host.launcher, this.host.qemuBinary];
    try {
      this.proc = spawn(cmd!, [...pre, ...args], {
        stdio: ['ignore', 'ignore', log.fd],
        detached: false,
      });
    } finally {
      await log.close();
    }
    this.proc.once('exit', (code, signal) => {
      this.exited = true;
      this.exitInfo = signal ? `signal ${signal}` : `code ${code}`;
      this.agent?.close();
      this.resolveExit();
      if (!this.destroyed) this.emit('died', `the VM exited (${this.exitInfo})`);
    });
    this.proc.once('error', () => undefined);
    const exitedEarly = this.exitPromise.then(() => {
      throw new VmError(`QEMU exited during start-up (${this.exitInfo})`);
    });
    this.qmp = await Promise.race([QmpClient.connect(this.paths.qmpSocket, deadline), exitedEarly]);
    this.qmp.on('close', () => undefined);
  }

  private async connectAgent(deadline: number): Promise<void> {
    const agent = await AgentChannel.connect(
      this.paths.agentSocket,
      this.paths.replSocket,
      deadline,
    );
    this.agent = agent;
    agent.on('close', () => {
      if (this.destroyed || this.exited) return;
      // A dying QEMU closes the socket a moment before its exit is seen: wait for that, so
      // the reason says what happened.
      const lost = setTimeout(() => this.emit('died', 'the guest agent connection was lost'), 500);
      void this.exitPromise.then(() => clearTimeout(lost));
    });
  }

  private requireAgent(): AgentChannel {
    if (!this.agent) throw new VmError('VM has no agent connection');
    return this.agent;
  }

  /**
   * Restores device state into a QEMU started with `-incoming defer`, which then runs the
   * guest by itself (no `-S`): its RESUME event ends the wait. The stream has no RAM section
   * (xen-save-devices-state writes none), so RAM stays what the image file holds. A failed
   * load makes QEMU exit, which closes QMP and ends the wait too.
   */
  private async incoming(deviceState: Buffer, deadline: number): Promise<void> {
    const qmp = this.requireQmp();
    const sock = join(this.dir, 'in.sock');
    const running = qmp.waitEvent('RESUME', () => true, Math.max(1, deadline - Date.now()));
    running.catch(() => undefined); // awaited below, unless an earlier step throws
    await qmp.execute('migrate-incoming', { uri: `unix:${sock}` });
    await sendStream(sock, deviceState, deadline);
    await running;
  }

  /** Saves the (stopped) VM's device state, without RAM, through a file in its directory. */
  private async saveDeviceState(): Promise<Buffer> {
    const file = join(this.dir, 'device.state');
    await this.requireQmp().execute('xen-save-devices-state', { filename: file, live: false });
    const state = await readBounded(file, 64 * 1024 * 1024);
    await rm(file, { force: true });
    return state;
  }

  private requireQmp(): QmpClient {
    if (!this.qmp) throw new VmError('VM has no QMP connection');
    return this.qmp;
  }

  private async failStart(err: unknown): Promise<VmError> {
    const tail = await this.logTail(20);
    await this.destroy();
    const message = err instanceof Error ? err.message : String(err);
    return new VmError(message, tail);
  }
}
