/**
 * The jail each QEMU runs in when hostd runs as root (docs/operations.md, Security), the
 * Firecracker jailer's model on QEMU:
 * - a uid and gid of its own (vm/host/vm-uids.ts), in one shared group through which it reads
 *   the images and layers it is given; no capabilities, `no_new_privs` (setpriv);
 * - its own mount, PID, network (no interface but a down loopback), IPC, UTS and cgroup
 *   namespaces, with a /proc that shows only its own PID namespace (unshare): it sees no
 *   other process, so no other VM's command line, files or memory;
 * - in that mount namespace, a view of the state directory's `vms/` that holds its own folder
 *   only, and empty read-only folders over the host's places it never needs (`mountView`);
 * - a cgroup leaf with memory, pids and CPU-weight limits (vm/host/vm-cgroups.ts), when the host
 *   has the controllers;
 * - and QEMU's own seccomp filter (`-sandbox on`, vm/qemu/qemu-args.ts).
 * hostd makes every file; QEMU only opens what it is told, so a guest that takes over its QEMU
 * owns that VM's folder and overlay and nothing else.
 */
import { chmodSync, mkdirSync, realpathSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { findCommand } from './command-path.js';
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
  /**
   * Sets up VM `uid`'s jail, whose QEMU keeps `vmDir` (its folder); returns the argv prefix that
   * runs the rest of the command in it.
   */
  enter(uid: number, limits: VmLimits, vmDir: string): Promise<string[]>;
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
  /**
   * What the mount namespace hides (with `namespaces` only): every VM folder but its own under
   * `vmsDir`, and the folders of the mount table `table` (hideTable's; null: none).
   */
  readonly view?: { readonly vmsDir: string; readonly table: string | null };
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

  async enter(uid: number, limits: VmLimits, vmDir: string): Promise<string[]> {
    const procs = (await this.options.cgroups?.prepare(uid, limits)) ?? [];
    const { namespaces: ns, view } = this.options;
    return [
      ...joinCgroups(procs),
      ...(ns ? namespaces() : []),
      ...(ns && view ? mountView(view.vmsDir, vmDir, view.table) : []),
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
 * Places of the host that a jailed QEMU never opens a file in, hidden from it when they exist
 * (besides other VMs' folders): people's and services' files and scratch space. hostd's own
 * records, in the data directory, are added by main.
 */
export const HIDDEN_HOST_PATHS = [
  '/home',
  '/root',
  '/tmp',
  '/var/tmp',
  '/run',
  '/mnt',
  '/media',
  '/srv',
] as const;

/**
 * The `candidates` a jail may hide: those that neither are nor hold any of `needed` (the state,
 * data and cache directories, QEMU's binary and libraries: a host that keeps hostd's data
 * under /var/tmp keeps /var/tmp visible). Paths are compared as given: pass real paths.
 */
export function hiddenPaths(candidates: readonly string[], needed: readonly string[]): string[] {
  const within = (path: string, dir: string): boolean =>
    path === dir || path.startsWith(dir.endsWith('/') ? dir : `${dir}/`);
  return candidates.filter((c) => c !== '/' && !needed.some((n) => within(n, c)));
}

/**
 * The view of jailed QEMUs on this host: `vmsDir` narrowed to each VM's folder, and hidden
 * the places of HIDDEN_HOST_PATHS that exist and hold nothing of `needed` (the state, data and
 * cache directories, the template directory, the folder of QEMU's libcapstone stand-in), nor
 * QEMU's binary, plus hostd's records in `dataDir` (sandboxes, snapshots; made here if new, as
 * the records would make them).
 */
export function jailView(opts: {
  readonly vmsDir: string;
  readonly dataDir: string;
  /** Where the mount table goes: a file of root's, mode 0600. */
  readonly tablePath: string;
  readonly qemuBinary: string;
  readonly needed: readonly string[];
}): { vmsDir: string; table: string | null; hide: string[] } {
  const real = (p: string): string | null => {
    try {
      return realpathSync(p);
    } catch {
      return null; // no such path: nothing to hide, nothing needed there
    }
  };
  const found = findCommand(opts.qemuBinary);
  const qemu = found ? realpathSync(found.path) : null;
  const needed = [...opts.needed, ...(qemu ? [dirname(qemu)] : [])]
    .map(real)
    .filter((p): p is string => p !== null);
  const candidates = HIDDEN_HOST_PATHS.map(real).filter((p): p is string => p !== null);
  const records = ['sandboxes', 'snapshots'].map((d) => join(opts.dataDir, d));
  for (const r of records) mkdirSync(r, { recursive: true, mode: 0o700 });
  const hide = [...new Set(hiddenPaths(candidates, needed)), ...records];
  writeFileSync(opts.tablePath, hideTable(hide), { mode: 0o600 });
  chmodSync(opts.tablePath, 0o600);
  return { vmsDir: opts.vmsDir, table: opts.tablePath, hide };
}

/**
 * The mount table (fstab format) of the hidden folders: an empty read-only tmpfs over each, so
 * that one `mount -a` sets them all up (a `mount` process per folder cost ~10 ms each).
 */
export function hideTable(hide: readonly string[]): string {
  // fstab's escapes for the characters that would split a field or a line.
  const esc = (p: string): string =>
    p.replace(/[\\ \t\n]/g, (c) => `\\${c.charCodeAt(0).toString(8).padStart(3, '0')}`);
  return hide
    .map((p) => `hostd-jail ${esc(p)} tmpfs ro,mode=0555,size=4k,nosuid,nodev,noexec 0 0\n`)
    .join('');
}

/**
 * A shell step, run as root inside the new mount namespace (private: nothing propagates to the
 * host), that builds the VM's view and execs the rest: an empty tmpfs over `vmsDir` (root's,
 * mode 0711, read-only once set up) with only `vmDir` bound back into it, so the names and
 * sockets of other VMs are not there at all; then the mounts of `table` (hideTable's, a file
 * only root reads), if any. `vmDir` is bound through a descriptor opened before the tmpfs
 * covers it. Any step that fails fails the start (`mount -a` exits non-zero when any of its
 * mounts fails): the VM never runs with a partial view.
 */
export function mountView(vmsDir: string, vmDir: string, table: string | null): string[] {
  return [
    '/bin/sh',
    '-c',
    [
      'set -e',
      'vms=$1; own=$2; table=$3; shift 4',
      'exec 3< "$own"',
      'mount -t tmpfs -o mode=0711,size=64k,nosuid,nodev,noexec hostd-jail "$vms"',
      'mkdir -m 0700 "$own"',
      'mount --no-canonicalize --bind /proc/self/fd/3 "$own"',
      'exec 3<&-',
      'mount -o remount,ro "$vms"',
      'if [ -n "$table" ]; then mount -a -T "$table"; fi',
      'exec "$@"',
    ].join('\n'),
    'hostd-jail-view',
    vmsDir,
    vmDir,
    table ?? '',
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
