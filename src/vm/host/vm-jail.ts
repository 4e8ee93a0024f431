/**
 * The jail each QEMU runs in when hostd runs as root (docs/operations.md, Security): a uid and
 * gid of its own (vm/host/vm-uids.ts), no capabilities, `no_new_privs`, and the one shared
 * group through which every QEMU reads the images and layers it is given. hostd makes the
 * files; QEMU only opens what it is told, so a guest that takes over its QEMU owns that VM's
 * folder and overlay and nothing else.
 */
import type { VmUidPool } from './vm-uids.js';

/** What QemuProcess needs of a jail: an identity per VM, and the argv that enters it. */
export interface VmJail {
  /**
   * The group every jailed QEMU is in (hostd-vm's): images and frozen layers are root's and
   * readable (RAM images: writable, QEMU 7.2 maps them only from a read-write descriptor)
   * through it; the folders holding them can be entered, not listed.
   */
  readonly group: number;
  /** A uid (and gid of the same number) for a new VM. */
  allocate(): number;
  /** Marks the uid of a VM re-adopted after a restart as held; false when it is not a VM's. */
  claim(uid: number): boolean;
  /** Gives back a uid whose VM's process and files are gone. */
  release(uid: number): Promise<void>;
  /** The argv prefix that runs the rest of the command line jailed as VM `uid`. */
  launcher(uid: number): string[];
}

/** A jail of identity only: its own uid and gid, no capabilities, no_new_privs. */
export class UidJail implements VmJail {
  constructor(
    private readonly uids: VmUidPool,
    readonly group: number,
  ) {}

  allocate(): number {
    return this.uids.allocate();
  }

  claim(uid: number): boolean {
    return this.uids.claim(uid);
  }

  release(uid: number): Promise<void> {
    this.uids.release(uid);
    return Promise.resolve();
  }

  launcher(uid: number): string[] {
    return dropPrivileges(uid, this.group);
  }
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
