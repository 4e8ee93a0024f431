/**
 * One QEMU process: its folder of sockets and logs, its QMP session, its exit, and the two
 * device-state operations every snapshot and restore is made of. It knows nothing of the guest
 * agent or of images: vm.ts builds machines on top of it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, chown, mkdir, open, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { QmpClient } from './qmp.js';
import {
  qemuArgs,
  type DiskChain,
  type MachineSpec,
  type RamMode,
  type VmPaths,
} from './qemu-args.js';
import { ConsoleLog, CONSOLE_CAP_BYTES } from './console-log.js';
import { readBounded, readTail, truncateIfOver } from '../storage/safe-files.js';
import { connectWithRetry, sendAll } from '../channels/unix-socket.js';
import { VmError } from '../vm-error.js';
import { toVmError } from './as-vm-error.js';
import type { VmJail } from '../host/vm-jail.js';
import { HOST_VIEW, VmView, type FileView } from '../host/vm-view.js';
import { vmLimits } from '../host/vm-cgroups.js';

/** Where and how QEMU processes run on this host. */
export interface QemuHost {
  readonly qemuBinary: string;
  /** Directory under which each VM gets its own folder of sockets and logs. */
  readonly vmsDir: string;
  /** Extra argv put before QEMU (and its jail's); it must exec the rest in place. */
  readonly launcher: readonly string[];
  /**
   * When hostd runs as root: each QEMU runs jailed as a uid of its own, which owns its VM's
   * folder and overlay; RAM images and layers are root's, shared through the jail's group.
   */
  readonly jail?: VmJail;
  /** Added to QEMU's environment (LD_LIBRARY_PATH for vm/host/capstone-stand-in.ts). */
  readonly env?: Readonly<Record<string, string>>;
  /** The data directory, whose files a jailed QEMU opens through its view (vm/host/vm-view.ts). */
  readonly dataDir?: string;
}

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
  readonly consoleLogPath: string;
  private proc: ChildProcess | null = null;
  /** The pid of an attached QEMU, which is not this process's child. */
  private attachedPid: number | null = null;
  /** QEMU's pid when a jail's launcher forked it: the spawned process is then its keeper. */
  private jailedPid: number | undefined;
  private qmpClient: QmpClient | null = null;
  /** The jailed VM's own uid (and gid), given back once its process and folder are gone. */
  private jailUid: number | undefined;
  /** How QEMU names the data directory's files: through its view when its jail has one. */
  private fileView: FileView = HOST_VIEW;
  /** The console log hostd writes (vm/qemu/console-log.ts). */
  private consoleLog: ConsoleLog | null = null;
  /** A QEMU of an earlier hostd version writes the log itself: it is truncated every 10 s. */
  private consoleCap: NodeJS.Timeout | undefined;
  private exitInfo: string | null = null;
  /** `migrate-incoming` was sent: QEMU listens for the device state (`listenForState`). */
  private listening = false;
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
      consoleSocket: join(this.dir, 'console.sock'),
      procSocket: join(this.dir, 'proc.sock'),
    };
    this.consoleLogPath = join(this.dir, 'console.log');
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
    // Expected: no such process any more (''), which is the "not running" case below.
    const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    if (!cmdline.includes(`${p.dir}/`)) {
      throw new VmError('died', `the VM's QEMU (pid ${pid}) is not running any more`);
    }
    p.attachedPid = pid;
    if (host.jail) {
      // The folder's owner is the uid this VM was given by the hostd that started it.
      const { uid } = await stat(p.dir);
      if (host.jail.claim(uid)) p.jailUid = uid;
      // A QEMU started by a hostd from before views sees the host's data directory. Its view
      // is empty at rest: the folder is all it takes.
      const viewDir = host.jail.viewDir(p.id);
      if (viewDir && host.dataDir && existsSync(viewDir)) {
        p.fileView = new VmView(viewDir, host.dataDir);
      }
    }
    await p.connectConsole(deadline, true);
    p.qmpClient = await QmpClient.connect(p.paths.qmpSocket, deadline);
    p.qmpClient.once('close', () => p.onExit('the QEMU process is gone'));
    return p;
  }

  /** The uid a jailed QEMU runs as; undefined when QEMU runs as hostd's own user. */
  get uid(): number | undefined {
    return this.jailUid;
  }

  /** The names this QEMU opens files by (its view's, when jailed with one). */
  get view(): FileView {
    return this.fileView;
  }

  get pid(): number | undefined {
    return this.attachedPid ?? this.jailedPid ?? this.proc?.pid;
  }

  get qmp(): QmpClient {
    if (!this.qmpClient) throw new VmError('died', 'VM has no QMP connection');
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
    const running = this.qmp.waitEvent('RESUME', () => true, Math.max(1, deadline - Date.now()));
    running.catch(() => undefined); // awaited below, unless an earlier step throws
    await this.listenForState();
    await sendAll(this.stateSocket, deviceState, deadline);
    await running;
  }

  /**
   * Has this QEMU (started with `-incoming defer`) listen for the device state, without sending
   * it: a fork standby's QEMU does this when it starts, so that in the fork each child's restore
   * is one QMP round trip shorter (docs/architecture.md, "Fork: the host's part of a child").
   * QEMU only waits on the socket meanwhile; its block devices can still be added and reopened.
   */
  async listenForState(): Promise<void> {
    if (this.listening) return;
    await this.qmp.execute('migrate-incoming', { uri: `unix:${this.stateSocket}` });
    this.listening = true;
  }

  /** The socket an incoming QEMU reads its device state from (`listenForState`). */
  private get stateSocket(): string {
    return join(this.dir, 'in.sock');
  }

  /** Kills QEMU (if it runs) and removes its folder. Idempotent. */
  async kill(): Promise<void> {
    if (!this.killed) {
      this.killed = true;
      clearInterval(this.consoleCap);
      this.consoleCap = undefined;
      if (this.attachedPid !== null && !this.exited) {
        try {
          process.kill(this.attachedPid, 'SIGKILL');
        } catch {
          // gone already
        }
        // Its QMP socket closes when the kernel has reaped its files: that is the exit.
      } else {
        this.qmpClient?.close();
        if (this.proc && !this.exited) this.killSpawned();
        else if (!this.proc) this.resolveExit();
      }
    }
    await this.exitPromise;
    await this.consoleLog?.close();
    await rm(this.dir, { recursive: true, force: true });
    if (this.fileView instanceof VmView) {
      await rm(this.fileView.dir, { recursive: true, force: true });
    }
    if (this.jailUid !== undefined) {
      const uid = this.jailUid;
      this.jailUid = undefined;
      await this.host.jail?.release(uid);
    }
  }

  /** Last lines of the guest console (kernel and init messages) plus QEMU's stderr. */
  async logTail(lines = 30): Promise<string> {
    const read = async (p: string): Promise<string> =>
      (await readTail(p, 64 * 1024)).toString('utf8').split('\n').slice(-lines).join('\n');
    await this.consoleLog?.flushed(this.exited);
    const [consoleTail, qemuTail] = await Promise.all([
      read(this.consoleLogPath),
      read(join(this.dir, 'qemu.log')),
    ]);
    const lost = this.consoleLog?.lost ? ` (lines lost: ${this.consoleLog.lost})` : '';
    return `--- guest console (${this.id})${lost} ---\n${consoleTail}\n--- qemu stderr ---\n${qemuTail}`;
  }

  private onExit(info: string): void {
    if (this.exitInfo !== null) return;
    this.exitInfo = info;
    this.resolveExit();
    this.emit('exit', info);
  }

  /**
   * Kills it after `err` stopped it from starting; returns `err` as a VmError (`start_failed`
   * unless it says otherwise) with the log tail.
   */
  async failed(err: unknown): Promise<VmError> {
    const tail = await this.logTail(20);
    await this.kill();
    return toVmError(err, undefined, 'start_failed').in(undefined, tail);
  }

  /**
   * Connects the console socket to the console log. `adopting`: the QEMU was started by an
   * earlier hostd, which may be a version whose QEMU wrote the log itself (no socket): that log
   * is then truncated when it passes the cap, every 10 s, as that version did.
   */
  private async connectConsole(deadline: number, adopting: boolean): Promise<void> {
    let socket;
    try {
      socket = await connectWithRetry(this.paths.consoleSocket, adopting ? 0 : deadline);
    } catch (err) {
      if (!adopting || (err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      this.consoleCap = setInterval(
        () => void truncateIfOver(this.consoleLogPath, CONSOLE_CAP_BYTES),
        10_000,
      );
      this.consoleCap.unref();
      return;
    }
    this.consoleLog ??= await ConsoleLog.open(this.consoleLogPath).catch((err: unknown) => {
      socket.destroy();
      throw err;
    });
    this.consoleLog.attach(socket);
  }

  private async spawn(
    spec: MachineSpec,
    ram: RamMode,
    deadline: number,
    disk: DiskChain | undefined,
  ): Promise<void> {
    const { host } = this;
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    const uid = (this.jailUid = host.jail?.allocate());
    if (host.jail && uid !== undefined) {
      await chown(this.dir, uid, uid);
      const viewDir = host.jail.viewDir(this.id);
      if (viewDir && host.dataDir) {
        // Root's, entered by this VM's own group only: it lists the names of its own files.
        await mkdir(viewDir, { mode: 0o750 });
        await chown(viewDir, 0, uid);
        await chmod(viewDir, 0o750);
        this.fileView = new VmView(viewDir, host.dataDir);
      }
      // The one disk file this VM writes; every layer under it stays root's.
      if (disk) {
        await chown(disk.top, uid, uid);
        await chmod(disk.top, 0o600);
      }
      if (ram.kind === 'template') {
        // hostd creates the template's RAM file, so QEMU's account needs no right to create
        // files among the images (where it could plant links for hostd to follow).
        const fh = await open(ram.memPath, 'wx', 0o660);
        await fh.chown(0, host.jail.group);
        await fh.chmod(0o660);
        await fh.close();
      }
    }
    this.consoleLog = await ConsoleLog.open(this.consoleLogPath);
    const { image } = spec;
    const reads = [image.kernel, image.initrd, image.rootfs, ...(image.disk ? [image.disk] : [])];
    const jail =
      host.jail && uid !== undefined
        ? await host.jail.enter(uid, vmLimits(spec), this.dir, [...new Set(reads.map(dirname))])
        : [];
    const [cmd, ...pre] = [...host.launcher, ...jail, host.qemuBinary];
    const view = this.fileView;
    const seen = disk && {
      top: await view.expose(disk.top),
      layers: await Promise.all(disk.layers.map((l) => view.expose(l))),
    };
    const paths = seen ? { ...this.paths, writableDisk: seen } : this.paths;
    const seenRam = { ...ram, memPath: await view.expose(ram.memPath) };
    const log = await open(join(this.dir, 'qemu.log'), 'w');
    try {
      this.proc = spawn(cmd!, [...pre, ...qemuArgs(spec, paths, seenRam)], {
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
    // A launcher or QEMU binary that cannot be executed (no pid): its start fails with that at
    // once, instead of waiting for QMP until the deadline. With a pid, the error is a signal
    // that could not be sent (`kill`); the exit, when it comes, says the rest.
    const proc = this.proc;
    proc.on('error', (err: NodeJS.ErrnoException) => {
      if (proc.pid === undefined) this.onExit(`could not be run: ${err.code ?? err.message}`);
    });
    const exitedEarly = this.exitPromise.then(() => {
      throw new VmError('start_failed', `QEMU exited during start-up (${this.exitInfo})`);
    });
    exitedEarly.catch(() => undefined); // raced below, twice
    // First, before the guest runs: QEMU drops console output while nobody is connected.
    await Promise.race([this.connectConsole(deadline, false), exitedEarly]);
    this.qmpClient = await Promise.race([
      QmpClient.connect(this.paths.qmpSocket, deadline),
      exitedEarly,
    ]);
    this.qmpClient.on('close', () => undefined);
    // QEMU has opened every file of its command line by the time it answers QMP.
    for (const f of [seenRam.memPath, ...(seen ? [seen.top, ...seen.layers] : [])]) {
      await view.withdraw(f);
    }
    // QEMU answers QMP, so a jail's keeper has forked it by now.
    if (host.jail?.forks) this.jailedPid = onlyChild(this.proc.pid);
    // For operators, tests and re-adoption after a crash: which process is this VM.
    if (this.pid !== undefined) {
      await writeFile(join(this.dir, 'qemu.pid'), `${this.pid}\n`).catch(() => undefined);
    }
  }

  /**
   * SIGKILLs a QEMU this hostd spawned. In a jail that forks, QEMU itself, whose keeper then
   * exits with it; the keeper only when QEMU is not forked yet (it takes its child along then).
   */
  private killSpawned(): void {
    const proc = this.proc!;
    const qemu = this.jailedPid ?? (this.host.jail?.forks ? childOf(proc.pid) : undefined);
    if (qemu === undefined) {
      proc.kill('SIGKILL');
      return;
    }
    try {
      process.kill(qemu, 'SIGKILL');
    } catch {
      proc.kill('SIGKILL'); // it exited meanwhile: so does its keeper
    }
  }
}

/** The one child of process `pid` (a jail's keeper); undefined when it has none. */
function childOf(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const first = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(' ')[0];
    return first ? Number(first) : undefined;
  } catch {
    return undefined; // the keeper is gone
  }
}

function onlyChild(pid: number | undefined): number {
  const child = childOf(pid);
  if (child === undefined) throw new VmError('start_failed', 'the jailed QEMU is not running');
  return child;
}
