/**
 * One uid (and a gid of the same number) per VM, from a range no account uses
 * (SERVICE_VM_UID_RANGE), so that a guest which takes over its QEMU lands in a process that
 * shares no identity with any other VM: it cannot open another VM's sockets or overlay, read
 * another QEMU's memory through /proc, or signal it.
 *
 * A uid goes back to the pool when its VM's files are gone (QemuProcess.kill), and is handed out
 * again only when no process of that uid is left: a QEMU that outlived a hostd crash and was not
 * re-adopted keeps its uid until it is gone. A VM re-adopted after a restart gets its uid back
 * from the owner of its folder (`claim`).
 */
import { readdirSync, statSync } from 'node:fs';

/** An inclusive range of ids. */
export interface IdRange {
  readonly first: number;
  readonly last: number;
}

/** The default range: far above system and login accounts and the usual /etc/subuid blocks. */
export const DEFAULT_VM_UID_RANGE = '200000-265535';

/** Parses `first-last` (SERVICE_VM_UID_RANGE); throws with a message fit for the operator. */
export function parseIdRange(text: string): IdRange {
  const m = /^\s*(\d+)\s*-\s*(\d+)\s*$/.exec(text);
  const first = Number(m?.[1]);
  const last = Number(m?.[2]);
  if (!m || first < 1000 || last < first || last >= 2 ** 32 - 1) {
    throw new Error(
      `SERVICE_VM_UID_RANGE must be "first-last" with 1000 <= first <= last, got "${text}"`,
    );
  }
  return { first, last };
}

/** Accounts of `passwd` (the /etc/passwd format) whose uid or gid falls in `range`. */
export function accountsInRange(passwd: string, range: IdRange): string[] {
  const inRange = (n: number): boolean => n >= range.first && n <= range.last;
  return passwd
    .split('\n')
    .map((line) => line.split(':'))
    .filter((f) => f.length >= 4 && (inRange(Number(f[2])) || inRange(Number(f[3]))))
    .map((f) => f[0]!);
}

/** The uids that own a process on this host right now. */
export function processUids(): Set<number> {
  const uids = new Set<number>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      uids.add(statSync(`/proc/${entry}`).uid);
    } catch {
      // exited while we looked
    }
  }
  return uids;
}

export class VmUidPool {
  private readonly taken = new Set<number>();
  /** Where the next search starts: uids are handed out in turn, so a freed one rests a while. */
  private cursor: number;

  constructor(
    readonly range: IdRange,
    /** The uids with a live process (a parameter so that unit tests need no real processes). */
    private readonly liveUids: () => Set<number> = processUids,
  ) {
    this.cursor = range.first;
  }

  get inUse(): number {
    return this.taken.size;
  }

  /** A uid no VM of this hostd holds and no process runs as; throws when the range is used up. */
  allocate(): number {
    const { first, last } = this.range;
    const size = last - first + 1;
    const live = this.liveUids();
    for (let i = 0; i < size; i++) {
      const uid = first + ((this.cursor - first + i) % size);
      if (this.taken.has(uid) || live.has(uid)) continue;
      this.taken.add(uid);
      this.cursor = uid === last ? first : uid + 1;
      return uid;
    }
    throw new Error(`no free uid left in SERVICE_VM_UID_RANGE ${first}-${last}`);
  }

  /** Marks `uid` held by a VM re-adopted after a restart; false when it is not of this range. */
  claim(uid: number): boolean {
    if (uid < this.range.first || uid > this.range.last) return false;
    this.taken.add(uid);
    return true;
  }

  /** True while a VM of this hostd holds `uid`. */
  holds(uid: number): boolean {
    return this.taken.has(uid);
  }

  /** Gives `uid` back: its VM's process and files are gone. */
  release(uid: number): void {
    this.taken.delete(uid);
  }
}
