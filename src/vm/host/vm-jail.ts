/**
 * The jail each QEMU runs in when hostd runs as root (docs/operations.md, Security), the
 * Firecracker jailer's model on QEMU:
 * - a uid and gid of its own (vm/host/vm-uids.ts), in one shared group through which it reads
 *   the images and layers it is given; no capabilities, `no_new_privs` (setpriv);
 * - its own mount, PID, network (no interface but a down loopback), IPC, UTS and cgroup
 *   namespaces, with a /proc that shows only its own PID namespace (unshare): it sees no
 *   other process, so no other VM's command line, files or memory;
 * - a cgroup leaf with memory, pids and CPU-weight limits (vm/host/vm-cgroups.ts), when the host
 *   has the controllers;
 * - and QEMU's own seccomp filter (`-sandbox on`, vm/qemu/qemu-args.ts).
 * hostd makes every file; QEMU only opens what it is told, so a guest that takes over its QEMU
 * owns that VM's folder and overlay and nothing else.
 */
import type { VmCgroups, VmLimits } from './vm-cgroups.js';
import type { VmUidPool } from './vm-uids.js';

/** What QemuProcess needs of a jail: an identity per VM, and the argv that enters it. */
export interface VmJail {
  /**
   * The group every jailed QEMU is in (hostd-vm's): images and frozen layers are root's and
   * readable (RAM images: writable, QEMU 7.2 maps them only from a read-write descriptor)
   * through it; the folders holding them can be entered, not listed.
   */
  readonly group: number;
  /**
   * True when the launcher forks once (a PID namespace needs a new process): the process
   * spawned is then the jail's keeper, and QEMU is its only child.
   */
  readonly forks: boolean;
  /** A uid (and gid of the same number) for a new VM. */
  allocate(): number;
  /** Marks the uid of a VM re-adopted after a restart as held; false when it is not a VM's. */
  claim(uid: number): boolean;
  /** Gives back a uid whose VM's process and files are gone. */
  release(uid: number): Promise<void>;
  /** Sets up VM `uid`'s jail; returns the argv prefix that runs the rest of the command in it. */
  enter(uid: number, limits: VmLimits): Promise<string[]>;
  /**
   * Removes what jails of VMs that are gone left behind (their empty cgroup leaves, older than
   * `minAgeMs`), once the VMs this hostd re-adopted are claimed; returns how many leaves went.
   */
  sweep(minAgeMs?: number): number;
}

export interface JailOptions {
  /** Namespaces (unshare); off: identity only. */
  readonly namespaces: boolean;
  /** Cgroup leaves per VM; null: none (the host has no usable controllers). */
  readonly cgroups: VmCgroups | null;
}

export class Jail implements VmJail {
  constructor(
    private readonly uids: VmUidPool,
    readonly group: number,
    private readonly options: JailOptions,
  ) {}

  get forks(): boolean {
    return this.options.namespaces;
  }

  allocate(): number {
    return this.uids.allocate();
  }

  claim(uid: number): boolean {
    return this.uids.claim(uid);
  }

  async release(uid: number): Promise<void> {
    await this.options.cgroups?.remove(uid);
    this.uids.release(uid);
  }

  sweep(minAgeMs = 60_000): number {
    const held = (uid: number): boolean => this.uids.holds(uid);
    return this.options.cgroups?.sweep(this.uids.range, held, minAgeMs) ?? 0;
  }

  async enter(uid: number, limits: VmLimits): Promise<string[]> {
    const procs = (await this.options.cgroups?.prepare(uid, limits)) ?? [];
    return [
      ...joinCgroups(procs),
      ...(this.options.namespaces ? namespaces() : []),
      ...dropPrivileges(uid, this.group),
    ];
  }
}

/**
 * A shell step that moves itself into each of `procs` (cgroup.procs files) and execs the rest,
 * so that everything after it starts inside the VM's leaf.
 */
export function joinCgroups(procs: readonly string[]): string[] {
  if (!procs.length) return [];
  return [
    '/bin/sh',
    '-c',
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"',
    'hostd-jail',
    ...procs,
    '--',
  ];
}

/**
 * unshare's argv: new mount, PID, network, IPC, UTS and cgroup namespaces, /proc remounted for
 * the new PID namespace, and the rest forked as its first process (its PID 1), killed if
 * unshare is killed before the rest changes its uid.
 */
export function namespaces(): string[] {
  return [
    'unshare',
    '--mount',
    '--pid',
    '--net',
    '--ipc',
    '--uts',
    '--cgroup',
    '--fork',
    '--kill-child=SIGKILL',
    '--mount-proc',
    '--',
  ];
}

/**
 * setpriv's argv that becomes `uid`:`uid` with `group` as the only other group, with an empty
 * capability bounding set and no_new_privs, and execs the rest in place.
 */
export function dropPrivileges(uid: number, group: number): string[] {
  return [
    'setpriv',
    '--reuid',
    String(uid),
    '--regid',
    String(uid),
    '--groups',
    String(group),
    '--inh-caps=-all',
    '--bounding-set=-all',
    '--no-new-privs',
    '--',
  ];
}
