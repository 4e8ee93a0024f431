/**
 * One QEMU process: its folder of sockets and logs, its QMP session, its exit, and the two
 * device-state operations every snapshot and restore is made of. It knows nothing of the guest
 * agent or of images: vm.ts builds machines on top of it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { chown, mkdir, open, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { QmpClient } from './qmp.js';
import {
  qemuArgs,
  type DiskChain,
  type MachineSpec,
  type RamMode,
  type VmPaths,
} from './qemu-args.js';
import { readBounded, readTail, truncateIfOver } from '../storage/safe-files.js';
import { sendAll } from '../channels/unix-socket.js';

/** Where and how QEMU processes run on this host. */
export interface QemuHost {
  readonly qemuBinary: string;
  /** Directory under which each VM gets its own folder of sockets and logs. */
  readonly vmsDir: string;
  /** Extra argv put before QEMU (e.g. setpriv dropping privileges); it must exec QEMU in place. */
  readonly launcher: readonly string[];
  /** When QEMU runs as another user: that user owns each VM's directory and its RAM images. */
  readonly owner?: { uid: number; gid: number };
  /** Added to QEMU's environment (LD_LIBRARY_PATH for vm/host/capstone-stand-in.ts). */
  readonly env?: Readonly<Record<string, string>>;
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

/** A guest writing to its console without end must not fill host memory (tmpfs). */
const CONSOLE_CAP_BYTES = 1024 * 1024;
/** Device states are ~8 KB; anything near this is a broken or hostile QEMU. */
const MAX_DEVICE_STATE = 64 * 1024 * 1024;

let counter = 0;

/**
 * QEMU's whole environment. Not hostd's: that holds SERVICE_API_KEYS, which a guest that broke
 * into its QEMU could read from /proc/self/environ. (One malloc arena, MALLOC_ARENA_MAX=1, was
 * measured too: QEMU's memory only moved from thread arenas to the main heap.)
 */
const QEMU_ENV: NodeJS.ProcessEnv = {
  PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
  LANG: 'C',
};

/**
 * Emits `exit` (with a description such as `signal SIGKILL`) once, when QEMU exits. A QEMU is
 * either spawned by this hostd or attached after a restart (`attach`): it does not die with
 * hostd, so a crash of hostd loses no VM.
 */
export class QemuProcess extends EventEmitter {
  readonly id: string;
  readonly dir: string;
  readonly paths: VmPaths;
  private proc: ChildProcess | null = null;
  /** The pid of an attached QEMU, which is not this process's child. */
  private attachedPid: number | null = null;
  private qmpClient: QmpClient | null = null;
  private consoleCap: NodeJS.Timeout | undefined;
  private exitInfo: string | null = null;
  private killed = false;
  private readonly exitPromise: Promise<void>;
  private resolveExit!: () => void;

  private constructor(
    readonly host: QemuHost,
    id?: string,
  ) {
    super();
    this.id = id ?? `vm${process.pid.toString(36)}-${(++counter).toString(36)}`;
    this.dir = join(host.vmsDir, this.id);
    this.paths = {
      qmpSocket: join(this.dir, 'qmp.sock'),
      agentSocket: join(this.dir, 'agent.sock'),
      replSocket: join(this.dir, 'repl.sock'),
      filesSocket: join(this.dir, 'files.sock'),
      netSocket: join(this.dir, 'net.sock'),
      procSocket: join(this.dir, 'proc.sock'),
      consoleLog: join(this.dir, 'console.log'),
    };
    this.exitPromise = new Promise((r) => (this.resolveExit = r));
  }

  /**
   * Spawns QEMU for `spec` with guest RAM backed as `ram` says, and connects QMP. On failure
   * everything it made is removed and a VmError carries the log tail.
   */
  static async start(
    host: QemuHost,
    spec: MachineSpec,
    ram: RamMode,
    deadline: number,
    disk?: DiskChain,
  ): Promise<QemuProcess> {
    const p = new QemuProcess(host);
    try {
      await p.spawn(spec, ram, deadline, disk);
      return p;
    } catch (err) {
      throw await p.failed(err);
    }
  }

  get exited(): boolean {
    return this.exitInfo !== null;
  }

  /** How it exited, e.g. `code 1` or `signal SIGKILL`; null while it runs. */
  get exitDescription(): string | null {
    return this.exitInfo;
  }

  /**
   * Attaches to the QEMU of folder `id` that an earlier hostd started, as process `pid`: checks
   * that the process is that QEMU, then connects QMP. Its exit shows as QMP closing, since it is
   * not this process's child.
   */
  static async attach(
    host: QemuHost,
    id: string,
    pid: number,
    deadline: number,
  ): Promise<QemuProcess> {
    const p = new QemuProcess(host, id);
    const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    if (!cmdline.includes(`${p.dir}/`)) {
      throw new VmError(`the VM's QEMU (pid ${pid}) is not running any more`);
    }
    p.attachedPid = pid;
    p.qmpClient = await QmpClient.connect(p.paths.qmpSocket, deadline);
    p.qmpClient.once('close', () => p.onExit('the QEMU process is gone'));
    return p;
  }

  get pid(): number | undefined {
    return this.attachedPid ?? this.proc?.pid;
  }

  get qmp(): QmpClient {
    if (!this.qmpClient) throw new VmError('VM has no QMP connection');
    return this.qmpClient;
  }

  /** Resolves when QEMU has exited. */
  whenExited(): Promise<void> {
    return this.exitPromise;
  }

  /** Saves the (stopped) VM's device state, without RAM, through a file in its directory. */
  async saveDeviceState(): Promise<Buffer> {
    const file = join(this.dir, 'device.state');
    await this.qmp.execute('xen-save-devices-state', { filename: file, live: false });
    const state = await readBounded(file, MAX_DEVICE_STATE);
    await rm(file, { force: true });
    return state;
  }

  /**
   * Restores `deviceState` into a QEMU started with `-incoming defer`, which then runs the
   * guest by itself (no `-S`): its RESUME event ends the wait. The stream has no RAM section
   * (xen-save-devices-state writes none), so RAM stays what the image file holds. A failed load
   * makes QEMU exit, which closes QMP and ends the wait too.
   */
  async loadDeviceState(deviceState: Buffer, deadline: number): Promise<void> {
    const sock = join(this.dir, 'in.sock');
    const running = this.qmp.waitEvent('RESUME', () => true, Math.max(1, deadline - Date.now()));
    running.catch(() => undefined); // awaited below, unless an earlier step throws
    await this.qmp.execute('migrate-incoming', { uri: `unix:${sock}` });
    await sendAll(sock, deviceState, deadline);
    await running;
  }

  /** Kills QEMU (if it runs) and removes its folder. Idempotent. */
  async kill(): Promise<void> {
    if (!this.killed) {
      this.killed = true;
      clearInterval(this.consoleCap);
      if (this.attachedPid !== null && !this.exited) {
        try {
          process.kill(this.attachedPid, 'SIGKILL');
        } catch {
          // gone already
        }
        // Its QMP socket closes when the kernel has reaped its files: that is the exit.
      } else {
        this.qmpClient?.close();
        if (this.proc && !this.exited) this.proc.kill('SIGKILL');
        else if (!this.proc) this.resolveExit();
      }
    }
    await this.exitPromise;
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

  private onExit(info: string): void {
    if (this.exitInfo !== null) return;
    this.exitInfo = info;
    this.resolveExit();
    this.emit('exit', info);
  }

  /** Kills it and returns `err` as a VmError with the log tail. */
  async failed(err: unknown): Promise<VmError> {
    const tail = await this.logTail(20);
    await this.kill();
    if (err instanceof VmError) return new VmError(err.message, err.consoleTail || tail);
    return new VmError(err instanceof Error ? err.message : String(err), tail);
  }

  private async spawn(
    spec: MachineSpec,
    ram: RamMode,
    deadline: number,
    disk: DiskChain | undefined,
  ): Promise<void> {
    const { host } = this;
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    if (host.owner) await chown(this.dir, host.owner.uid, host.owner.gid);
    if (ram.kind === 'template' && host.owner) {
      // hostd creates the template's RAM file, so QEMU's account needs no right to create
      // files among the images (where it could plant links for hostd to follow).
      const fh = await open(ram.memPath, 'wx', 0o600);
      await fh.chown(host.owner.uid, host.owner.gid);
      await fh.close();
    }
    this.consoleCap = setInterval(
      () => void truncateIfOver(this.paths.consoleLog, CONSOLE_CAP_BYTES),
      10_000,
    );
    this.consoleCap.unref();
    const log = await open(join(this.dir, 'qemu.log'), 'w');
    const [cmd, ...pre] = [...host.launcher, host.qemuBinary];
    const paths = disk ? { ...this.paths, writableDisk: disk } : this.paths;
    try {
      this.proc = spawn(cmd!, [...pre, ...qemuArgs(spec, paths, ram)], {
        stdio: ['ignore', 'ignore', log.fd],
        env: host.env ? { ...QEMU_ENV, ...host.env } : QEMU_ENV,
        // Its own session: a Ctrl-C in the terminal that runs hostd must not reach the VMs
        // (hostd pauses them on SIGINT), nor must hostd's death take them along.
        detached: true,
      });
    } finally {
      await log.close();
    }
    this.proc.once('exit', (code, signal) =>
      this.onExit(signal ? `signal ${signal}` : `code ${code}`),
    );
    this.proc.once('error', () => undefined);
    // For operators and tests: which process is this VM (the launcher execs QEMU in place).
    if (this.proc.pid !== undefined) {
      await writeFile(join(this.dir, 'qemu.pid'), `${this.proc.pid}\n`).catch(() => undefined);
    }
    const exitedEarly = this.exitPromise.then(() => {
      throw new VmError(`QEMU exited during start-up (${this.exitInfo})`);
    });
    this.qmpClient = await Promise.race([
      QmpClient.connect(this.paths.qmpSocket, deadline),
      exitedEarly,
    ]);
    this.qmpClient.on('close', () => undefined);
  }
}
