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
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

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
    for (const leaf of [memory, pids, cpu]) await mkdir(leaf, { recursive: true });
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
}

async function removeLeaf(leaf: string): Promise<void> {
  try {
    await rmdir(leaf);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // Gone already; or still busy for a moment (a process of the VM not yet reaped): the leaf
    // is then reused as it is by the next VM of this uid, which only comes once none is left.
    if (code !== 'ENOENT' && code !== 'EBUSY') throw err;
  }
}
