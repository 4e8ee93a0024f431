/**
 * Ready-made starts for forks. A fork of a sandbox restored from a template needs a copy of the
 * template image (hundreds of MB, a few hundred ms) and one new QEMU per child (~35 ms of CPU
 * each, most of it exec and dynamic linking). For each template, one copy is kept ready, with
 * QEMU processes already started on it and waiting for a device state (`Vm.standby`). A fork
 * takes the set, writes its parent's pages into the copy, and resumes up to n of them.
 *
 * How many QEMUs wait follows the template's last fork (at most `maxStandby`; agents tend to
 * fork the same width again): each costs ~15 MiB of host memory and no CPU while it waits.
 * The ones a fork does not use are bound to that fork's image and are stopped, so sizing by
 * the largest recent fork would waste a set of starts on every narrower fork after it. The
 * price of the copy itself is one image's worth of tmpfs per template.
 */
import { rename, rm, stat } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { dirname, join } from 'node:path';
import type { MachineSpec } from './qemu-args.js';
import { copyImage } from './mem-image.js';
import { Vm, type VmHost } from './vm.js';

interface Spare {
  readonly path: string;
  readonly vms: Vm[];
  taken: boolean;
}

interface Base {
  readonly host: VmHost;
  readonly spec: MachineSpec;
  /** Children of the last fork of this base: how many QEMUs the next set starts. */
  lastFork: number;
  ready: Spare | null;
  /** The copy (and its QEMUs) being made, if any. */
  making: Promise<void> | null;
  /** A fork took the copy while it was being made: make the next one when this one ends. */
  again: boolean;
}

export class SpareCopies {
  private readonly bases = new Map<string, Base>();
  private closed = false;
  private shortage: (vms: number, imageMib: number) => string | null = () => null;

  constructor(
    /** Most QEMUs kept waiting per template; 0 keeps only the copy. */
    private readonly maxStandby = 32,
  ) {}

  /**
   * Makes copies and standby QEMUs only while `shortage` (why the host could not afford that
   * many more VMs and MiB of image, or null) says the host can: they are a speed-up, never
   * worth the memory a sandbox needs.
   */
  limitBy(shortage: (vms: number, imageMib: number) => string | null): void {
    this.shortage = shortage;
  }

  /** Keeps a copy of the template image `base` (a machine `spec`) ready from now on. */
  register(host: VmHost, base: string, spec: MachineSpec): void {
    this.bases.set(base, { host, spec, lastFork: 1, ready: null, making: null, again: false });
    this.make(base);
  }

  /**
   * Moves the ready copy of `base` to `target` for a fork into `children` VMs, and returns the
   * QEMUs waiting on it (maybe none). Returns null when no copy is ready: the caller copies
   * itself. Call `refill` once the fork is over.
   */
  async take(base: string, target: string, children: number): Promise<Vm[] | null> {
    const b = this.bases.get(base);
    if (!b) return null;
    b.lastFork = children;
    const spare = b.ready;
    if (!spare) return null;
    b.ready = null;
    spare.taken = true;
    const vms = spare.vms.splice(0);
    try {
      await rename(spare.path, target);
    } catch {
      await Promise.all(vms.map((vm) => vm.destroy()));
      await rm(spare.path, { force: true });
      return null;
    }
    return vms;
  }

  /** Starts making the copies (and waiting QEMUs) that forks took. */
  refill(): void {
    for (const base of this.bases.keys()) this.make(base);
  }

  /** QEMUs waiting, over all templates (a metric). */
  get standingBy(): number {
    let n = 0;
    for (const b of this.bases.values())
      n += b.ready?.vms.filter((vm) => vm.standingBy).length ?? 0;
    return n;
  }

  /** True while a copy or its QEMUs are being made (the benchmark waits for the end). */
  get filling(): boolean {
    return [...this.bases.values()].some((b) => b.making !== null);
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.bases.values()].map((b) => b.making));
    const spares = [...this.bases.values()].flatMap((b) => (b.ready ? [b.ready] : []));
    for (const b of this.bases.values()) b.ready = null;
    await Promise.all(spares.map((s) => discard(s)));
  }

  private make(base: string): void {
    const b = this.bases.get(base);
    if (!b || this.closed || b.ready) return;
    if (b.making) {
      b.again = true;
      return;
    }
    b.making = this.fill(b, base)
      .catch(() => undefined) // a speed-up that failed: the next fork copies for itself
      .finally(() => {
        b.making = null;
        if (b.again) {
          b.again = false;
          this.make(base);
        }
      });
  }

  private async fill(b: Base, base: string): Promise<void> {
    const spare: Spare = {
      path: join(dirname(base), `spare-${randomBytes(6).toString('hex')}.mem`),
      vms: [],
      taken: false,
    };
    try {
      const imageMib = ((await stat(base)).blocks * 512) / 1024 / 1024;
      if (this.shortage(0, imageMib)) return; // the next fork copies for itself, and retries
      await copyImage(base, spare.path, b.host.owner);
    } catch {
      await rm(spare.path, { force: true });
      return;
    }
    if (this.closed) {
      await rm(spare.path, { force: true });
      return;
    }
    b.ready = spare;
    // One at a time, in the background: starting them all at once would compete for the CPU
    // with the children of the fork that just ended.
    const want = Math.min(this.maxStandby, b.lastFork);
    while (spare.vms.length < want && !spare.taken && !this.closed && !this.shortage(1, 0)) {
      let vm: Vm;
      try {
        vm = await Vm.standby(b.host, b.spec, spare.path);
      } catch {
        return; // the copy is still worth having; the next fork starts its own QEMUs
      }
      if (spare.taken || this.closed) {
        await vm.destroy();
        // Taken (renamed) before this QEMU opened the file, it may have created an empty
        // one in its place (it can when it runs as hostd's own user).
        if (spare.taken) await rm(spare.path, { force: true });
        return;
      }
      spare.vms.push(vm);
    }
  }
}

async function discard(spare: Spare): Promise<void> {
  await Promise.all(spare.vms.splice(0).map((vm) => vm.destroy()));
  await rm(spare.path, { force: true });
}
