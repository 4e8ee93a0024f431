/**
 * A cgroup leaf per VM (`hostd-vms/vm-<uid>`), so that one sandbox's QEMU cannot take the host's
 * memory, its process table or more than its share of the CPU from the others: `memory.max`,
 * `pids.max` and `cpu.weight` under cgroup v2. A host whose memory, pids and cpu controllers are
 * still bound to cgroup v1 hierarchies (a "hybrid" host, as these build machines are) gets the
 * same three limits from v1's `memory.limit_in_bytes`, `pids.max` and `cpu.shares`. A host with
 * neither gets no leaf: main logs a warning (docs/operations.md, Security).
 *
 * The launcher joins the leaf itself before it execs QEMU (QemuProcess spawns it through a shell
 * step that writes its own pid into `cgroup.procs`), so QEMU never runs a moment outside it.
 */
import { existsSync, readdirSync, readFileSync, rmdirSync, statSync } from 'node:fs';
import { mkdir, rmdir, utimes, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { IdRange } from './vm-uids.js';

/** The limits of one VM's leaf. */
export interface VmLimits {
  readonly memoryBytes: number;
  readonly pids: number;
  /** Relative CPU share; 100 is cgroup v2's default (v1: cpu.shares = weight * 1024 / 100). */
  readonly cpuWeight: number;
}

/**
 * The limits of a VM of `spec`: its guest RAM, its translation buffer and 256 MiB for QEMU
 * itself and the page cache of its files; threads enough for QEMU's block I/O pool (seccomp
 * already forbids it to fork); a CPU weight in proportion to its vCPUs.
 */
export function vmLimits(spec: {
  readonly memoryMib: number;
  readonly tcgTbMib: number;
  readonly vcpus: number;
}): VmLimits {
  return {
    memoryBytes: (spec.memoryMib + Math.max(spec.tcgTbMib, 32) + 256) * 1024 * 1024,
    pids: 256,
    cpuWeight: 100 * spec.vcpus,
  };
}

/** The parent of every VM's leaf, in each hierarchy. */
const PARENT = 'hostd-vms';
const CONTROLLERS = ['memory', 'pids', 'cpu'] as const;

export interface VmCgroups {
  /** `v2`, or `v1` on a host whose controllers live in v1 hierarchies. */
  readonly version: 'v1' | 'v2';
  /** Creates (or reuses) VM `uid`'s leaf with `limits`; returns the `cgroup.procs` files to join. */
  prepare(uid: number, limits: VmLimits): Promise<string[]>;
  /** Removes VM `uid`'s leaf once its processes are gone. */
  remove(uid: number): Promise<void>;
  /**
   * Removes the empty leaves of uids in `range` that `held` says no VM holds (left by VMs that
   * ended while no hostd ran, or whose last process was slow to go) and that are older than
   * `minAgeMs` (by mtime); returns how many went.
   */
  sweep(range: IdRange, held: (uid: number) => boolean, minAgeMs: number): number;
}

/**
 * The uids of the leaves among `names` (a `hostd-vms` folder's entries) that a sweep removes:
 * `vm-<uid>` with `uid` in `range` (another hostd's range is not ours to touch) that no VM holds.
 */
export function staleLeafUids(
  names: readonly string[],
  range: IdRange,
  held: (uid: number) => boolean,
): number[] {
  const uids: number[] = [];
  for (const name of names) {
    const m = /^vm-(\d+)$/.exec(name);
    if (!m) continue;
    const uid = Number(m[1]);
    if (uid >= range.first && uid <= range.last && !held(uid)) uids.push(uid);
  }
  return uids;
}

/**
 * The cgroups this host offers hostd for its VMs, or null with why not (not root, no cgroup
 * filesystem, controllers missing).
 */
export async function detectCgroups(
  root = '/sys/fs/cgroup',
): Promise<{ cgroups: VmCgroups } | { cgroups: null; why: string }> {
  if (process.getuid?.() !== 0) return { cgroups: null, why: 'hostd does not run as root' };
  for (const v2 of [root, join(root, 'unified')]) {
    const controllers = readWords(join(v2, 'cgroup.controllers'));
    if (controllers && CONTROLLERS.every((c) => controllers.includes(c))) {
      const cg = new V2Cgroups(v2);
      await cg.init();
      return { cgroups: cg };
    }
  }
  const v1 = CONTROLLERS.map((c) => join(root, c));
  if (v1.every((d) => existsSync(join(d, 'cgroup.procs')))) {
    const cg = new V1Cgroups(v1);
    await cg.init();
    return { cgroups: cg };
  }
  return {
    cgroups: null,
    why: `no cgroup v2 with the memory, pids and cpu controllers (nor v1 hierarchies of them) under ${root}`,
  };
}

function readWords(path: string): string[] | null {
  try {
    return readFileSync(path, 'utf8').trim().split(/\s+/);
  } catch {
    return null; // no such file: not a cgroup v2 mount
  }
}

class V2Cgroups implements VmCgroups {
  readonly version = 'v2';
  private readonly parent: string;

  constructor(private readonly root: string) {
    this.parent = join(root, PARENT);
  }

  async init(): Promise<void> {
    // Leaves get controllers only through their parents' subtree_control.
    await writeFile(join(this.root, 'cgroup.subtree_control'), '+memory +pids +cpu');
    await mkdir(this.parent, { recursive: true });
    await writeFile(join(this.parent, 'cgroup.subtree_control'), '+memory +pids +cpu');
  }

  async prepare(uid: number, limits: VmLimits): Promise<string[]> {
    const leaf = join(this.parent, `vm-${uid}`);
    await mkdir(leaf, { recursive: true });
    await markInUse(leaf);
    await writeFile(join(leaf, 'memory.max'), String(limits.memoryBytes));
    // Absent without swap accounting: then there is no swap to cap.
    const swap = join(leaf, 'memory.swap.max');
    if (existsSync(swap)) await writeFile(swap, '0');
    await writeFile(join(leaf, 'pids.max'), String(limits.pids));
    await writeFile(join(leaf, 'cpu.weight'), String(limits.cpuWeight));
    return [join(leaf, 'cgroup.procs')];
  }

  async remove(uid: number): Promise<void> {
    await removeLeaf(join(this.parent, `vm-${uid}`));
  }

  sweep(range: IdRange, held: (uid: number) => boolean, minAgeMs: number): number {
    return sweepLeaves([this.parent], range, held, minAgeMs);
  }
}

class V1Cgroups implements VmCgroups {
  readonly version = 'v1';

  constructor(
    /** The memory, pids and cpu hierarchies, in that order. */
    private readonly roots: string[],
  ) {}

  async init(): Promise<void> {
    for (const r of this.roots) await mkdir(join(r, PARENT), { recursive: true });
  }

  async prepare(uid: number, limits: VmLimits): Promise<string[]> {
    const [memory, pids, cpu] = this.roots.map((r) => join(r, PARENT, `vm-${uid}`)) as [
      string,
      string,
      string,
    ];
    for (const leaf of [memory, pids, cpu]) {
      await mkdir(leaf, { recursive: true });
      await markInUse(leaf);
    }
    await writeFile(join(memory, 'memory.limit_in_bytes'), String(limits.memoryBytes));
    await writeFile(join(pids, 'pids.max'), String(limits.pids));
    await writeFile(
      join(cpu, 'cpu.shares'),
      String(Math.max(2, Math.round((limits.cpuWeight * 1024) / 100))),
    );
    return [memory, pids, cpu].map((leaf) => join(leaf, 'cgroup.procs'));
  }

  async remove(uid: number): Promise<void> {
    for (const r of this.roots) await removeLeaf(join(r, PARENT, `vm-${uid}`));
  }

  sweep(range: IdRange, held: (uid: number) => boolean, minAgeMs: number): number {
    return sweepLeaves(
      this.roots.map((r) => join(r, PARENT)),
      range,
      held,
      minAgeMs,
    );
  }
}

/**
 * Removes the stale leaves under each of `parents`. Synchronous on purpose: between reading
 * `held` and the rmdir, no allocation of the same uid (whose leaf is then being prepared) can
 * run. A leaf that still holds a process (EBUSY) stays, and so does a young one: another hostd
 * misconfigured onto an overlapping uid range may have just prepared it for a QEMU that has
 * not joined it yet.
 */
function sweepLeaves(
  parents: readonly string[],
  range: IdRange,
  held: (uid: number) => boolean,
  minAgeMs: number,
): number {
  const bornBefore = Date.now() - minAgeMs;
  let removed = 0;
  for (const parent of parents) {
    let names: string[];
    try {
      names = readdirSync(parent);
    } catch {
      continue; // no parent (yet): nothing of ours to sweep
    }
    for (const uid of staleLeafUids(names, range, held)) {
      const leaf = join(parent, `vm-${uid}`);
      try {
        if (statSync(leaf).mtimeMs > bornBefore) continue;
        rmdirSync(leaf);
        removed++;
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        // Gone meanwhile; or holding a process (EBUSY; ENOTEMPTY where it is a plain folder).
        if (code !== 'ENOENT' && code !== 'EBUSY' && code !== 'ENOTEMPTY') throw err;
      }
    }
  }
  return removed;
}

/**
 * Dates a leaf now: one left by an earlier VM of this uid and reused is as young as a new one
 * to a sweep (which spares young leaves).
 */
async function markInUse(leaf: string): Promise<void> {
  const now = new Date();
  await utimes(leaf, now, now);
}

/** How long a leaf's last process may take to leave it after the VM's exit was seen. */
const LEAF_DRAIN_MS = 5_000;

/**
 * Removes a leaf. Its VM's exit can be seen (QMP closing, for a re-adopted VM) a moment before
 * the kernel has taken the process out of the leaf: then it waits, bounded, until the leaf is
 * empty. A leaf still busy after that stays; the next start's sweep removes it, and a VM of the
 * same uid (which only comes once no process of it is left) would reuse it meanwhile.
 */
async function removeLeaf(leaf: string): Promise<void> {
  const until = Date.now() + LEAF_DRAIN_MS;
  for (;;) {
    try {
      await rmdir(leaf);
      return;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') return; // gone already
      if (code !== 'EBUSY') throw err;
      if (Date.now() >= until) return;
    }
    await sleep(20);
  }
}
