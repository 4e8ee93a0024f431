/**
 * The jail each QEMU runs in when hostd runs as root (docs/operations.md, Security), the
 * Firecracker jailer's model on QEMU:
 * - a uid and gid of its own (vm/host/vm-uids.ts), in one shared group through which it reads
 *   the images and layers it is given; no capabilities, `no_new_privs` (setpriv);
 * - its own mount, PID, network (no interface but a down loopback), IPC, UTS and cgroup
 *   namespaces, with a /proc that shows only its own PID namespace (unshare): it sees no
 *   other process, so no other VM's command line, files or memory;
 * - in that mount namespace, a view of the host built at each start (`viewTable`): the state
 *   directory's `vms/` holds its own folder only; the data directory holds only its view
 *   (`viewDir`), a folder of hard links to the images and layers it was given (vm/host/vm-view.ts);
 *   the template cache holds only the image folder it boots from; and empty read-only folders
 *   lie over the host's places it never needs;
 * - a cgroup leaf with memory, pids and CPU-weight limits (vm/host/vm-cgroups.ts), when the host
 *   has the controllers;
 * - and QEMU's own seccomp filter (`-sandbox on`, vm/qemu/qemu-args.ts).
 * hostd makes every file; QEMU only opens what it is told, so a guest that takes over its QEMU
 * owns that VM's folder and overlay and nothing else.
 */
import { chmodSync, mkdirSync, realpathSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { findCommand } from './command-path.js';
import type { VmCgroups, VmLimits } from './vm-cgroups.js';
import type { VmUidPool } from './vm-uids.js';

/** What QemuProcess needs of a jail: an identity per VM, and the argv that enters it. */
export interface VmJail {
  /**
   * The group every jailed QEMU is in (hostd-vm's): images and frozen layers are root's and
   * readable through it (RAM images too: vm/host/ram-open-shim.ts); the folders holding them can
   * be entered, not listed.
   */
  readonly group: number;
  /**
   * True when the launcher forks once (a PID namespace needs a new process): the process
   * spawned is then the jail's keeper, and QEMU is its only child.
   */
  readonly forks: boolean;
  /** A uid (and gid of the same number) for a new VM. */
  allocate(): number;
  /**
   * The folder of VM `id`'s QEMU that is all it sees of the data directory (made by the caller,
   * filled through vm/host/vm-view.ts); null when the jail has no mount namespace to narrow.
   */
  viewDir(id: string): string | null;
  /** Marks the uid of a VM re-adopted after a restart as held; false when it is not a VM's. */
  claim(uid: number): boolean;
  /** Gives back a uid whose VM's process and files are gone. */
  release(uid: number): Promise<void>;
  /**
   * Sets up VM `uid`'s jail, whose QEMU keeps `vmDir` (its folder) and opens files in the
   * folders `reads` outside the data directory (its image's); returns the argv prefix that runs
   * the rest of the command in it.
   */
  enter(uid: number, limits: VmLimits, vmDir: string, reads?: readonly string[]): Promise<string[]>;
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
  /** What each VM's mount namespace narrows and hides (with `namespaces` only): `jailView`'s. */
  readonly view?: JailView;
}

/** The host as every jailed QEMU's mount namespace shows it (see `viewTable`). */
export interface JailView {
  /** The state directory's `vms/`: only the VM's own folder shows in it. */
  readonly vmsDir: string;
  /** The data directory: only the VM's view folder (`<viewsDir>/<id>`) shows in it. */
  readonly dataDir: string;
  readonly viewsDir: string;
  /**
   * Folders only the folders a VM opens files in show in (the template cache: the VM's image
   * folder), besides `keep`.
   */
  readonly narrowed: readonly string[];
  /** Folders inside `narrowed` every VM keeps (QEMU's stand-in library's). */
  readonly keep: readonly string[];
  /** Host folders shown empty and read-only (`hiddenPaths`'s). */
  readonly hide: readonly string[];
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

  viewDir(id: string): string | null {
    const { namespaces: ns, view } = this.options;
    return ns && view ? join(view.viewsDir, id) : null;
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

  async enter(
    uid: number,
    limits: VmLimits,
    vmDir: string,
    reads: readonly string[] = [],
  ): Promise<string[]> {
    const procs = (await this.options.cgroups?.prepare(uid, limits)) ?? [];
    const { namespaces: ns, view } = this.options;
    let mounts: string[] = [];
    if (ns && view) {
      const within = (p: string, d: string): boolean => p === d || p.startsWith(`${d}/`);
      const binds = [
        vmDir,
        join(view.viewsDir, vmDir.slice(vmDir.lastIndexOf('/') + 1)),
        ...new Set([...view.keep, ...reads]),
      ].filter((d, i) => i < 2 || view.narrowed.some((n) => within(d, n)));
      const covers = [view.vmsDir, view.dataDir, ...view.narrowed];
      // In the VM's own folder: read once, as root, before QEMU runs; it goes with the folder.
      const table = join(vmDir, 'jail.fstab');
      await writeFile(table, viewTable(covers, binds, view.hide), { mode: 0o600 });
      mounts = mountView(table, binds);
    }
    return [
      ...joinCgroups(procs),
      ...(ns ? namespaces() : []),
      ...mounts,
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
 * The view of jailed QEMUs on this host: `vmsDir` narrowed to each VM's folder, `dataDir` to
 * each VM's view under `viewsDir` (made here, root's only: a QEMU reaches its view through its
 * mount namespace, never through the host's folders), `cacheDir` to the image folders each VM
 * opens and `keep`; and hidden the places of HIDDEN_HOST_PATHS that exist and hold nothing of
 * `needed` (the state, data and cache directories, the template directory, the folder of QEMU's
 * libcapstone stand-in), nor QEMU's binary.
 */
export function jailView(opts: {
  readonly vmsDir: string;
  readonly dataDir: string;
  readonly cacheDir: string;
  readonly keep: readonly string[];
  readonly qemuBinary: string;
  readonly needed: readonly string[];
}): JailView {
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
  const viewsDir = join(opts.dataDir, 'views');
  mkdirSync(viewsDir, { recursive: true, mode: 0o700 });
  chmodSync(viewsDir, 0o700);
  return {
    vmsDir: opts.vmsDir,
    dataDir: opts.dataDir,
    viewsDir,
    narrowed: [opts.cacheDir],
    keep: opts.keep,
    hide: [...new Set(hiddenPaths(candidates, needed))],
  };
}

/** fstab's escapes for the characters that would split a field or a line. */
const fstabPath = (p: string): string =>
  p.replace(/[\\ \t\n]/g, (c) => `\\${c.charCodeAt(0).toString(8).padStart(3, '0')}`);

const COVER = 'mode=0711,size=64k,nosuid,nodev,noexec';

/**
 * The mount table (fstab format) of one VM's view, so that one `mount -a` builds it all (a
 * `mount` process per folder cost ~10 ms each): an empty tmpfs over each of `covers`, outer
 * first; each of `binds` bound back into them from descriptor 3, 4, ... (`mountView` opens them
 * before anything covers them), its mount point made as needed; the covers made read-only;
 * then an empty read-only tmpfs over each of `hide` (which never holds a cover: `hiddenPaths`). Nothing of a covered folder shows but what is
 * bound back: other VMs' folders, views and images are not there at all.
 */
export function viewTable(
  covers: readonly string[],
  binds: readonly string[],
  hide: readonly string[],
): string {
  const outerFirst = [...new Set(covers)].sort((x, y) => x.length - y.length);
  return [
    ...outerFirst.map((c) => `hostd-jail ${fstabPath(c)} tmpfs ${COVER},X-mount.mkdir 0 0`),
    ...binds.map((b, i) => `/proc/self/fd/${i + 3} ${fstabPath(b)} none bind,X-mount.mkdir 0 0`),
    ...outerFirst.map((c) => `hostd-jail-ro ${fstabPath(c)} tmpfs remount,ro,${COVER} 0 0`),
    ...hide.map(
      (h) => `hostd-jail ${fstabPath(h)} tmpfs ro,mode=0555,size=4k,nosuid,nodev,noexec 0 0`,
    ),
  ]
    .map((line) => `${line}\n`)
    .join('');
}

/**
 * A shell step, run as root inside the new mount namespace (private: nothing propagates to the
 * host), that builds the VM's view (`viewTable`'s `table`) and execs the rest. `binds` are
 * opened as descriptors 3, 4, ... first, since the table's covers hide their paths, and closed
 * before the rest runs. Any step that fails fails the start (`mount -a` exits non-zero when
 * any of its mounts fails): the VM never runs with a partial view.
 */
export function mountView(table: string, binds: readonly string[]): string[] {
  return [
    '/bin/sh',
    '-c',
    [
      'set -e',
      'table=$1; shift',
      'fd=3; while [ "$1" != -- ]; do eval "exec $fd<\\"\\$1\\""; fd=$((fd + 1)); shift; done; shift',
      'mount -a --no-canonicalize -T "$table"',
      'while [ $fd -gt 3 ]; do fd=$((fd - 1)); eval "exec $fd<&-"; done',
      'exec "$@"',
    ].join('\n'),
    'hostd-jail-view',
    table,
    ...binds,
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
