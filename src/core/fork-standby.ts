/**
 * Fork standby: the policy of preparing forks ahead (the mechanism is the hypervisor's
 * ForkTarget). For each template state, one target is kept ready, with as many machines waiting
 * in it as that template's last fork had children (at most `maxWaiting`): agents tend to fork
 * the same width again. Waiting machines a fork does not use are bound to that fork's state and
 * are stopped, so sizing by the largest recent fork would waste a set of starts on every
 * narrower fork after it. Targets are made one machine at a time, shortly after each fork, in the
 * background, and only while the host can afford them: they are a speed-up, never worth the
 * memory a sandbox needs.
 */
import type { ForkTarget, FrozenState, Hypervisor } from '../vm/machine.js';

interface Entry {
  readonly base: FrozenState;
  /** Children of the last fork of this base: how many machines the next target starts. */
  lastFork: number;
  ready: ForkTarget | null;
  /** The target (and its machines) being made, if any. */
  making: Promise<void> | null;
  /** A fork took the target while it was being made: make the next one when this one ends. */
  again: boolean;
}

export class ForkStandby {
  private readonly entries = new Map<FrozenState, Entry>();
  private closed = false;
  private held = false;
  /** A refill scheduled by `refillAfterFork`, not started yet. */
  private refillTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly hypervisor: Hypervisor,
    /** Most incoming machines per template; 0 keeps only the prepared image. */
    private readonly maxStandby: number,
    /** Why the host cannot afford `vms` more VMs and `imageMib` of image now, or null. */
    private readonly shortage: (vms: number, imageMib: number) => string | null,
    /** Told why making a target failed (a speed-up lost: the next fork does the work itself). */
    private readonly onFailure: (err: unknown) => void = () => undefined,
    /** How long after a fork's end its refill starts (`refillAfterFork`). */
    private readonly afterForkMs = 300,
  ) {}

  /** Keeps a fork target ready for forks of machines restored from `base`, from now on. */
  register(base: FrozenState): void {
    // Two templates of one build share their frozen state (a second pool of `python` with
    // other resources): a second entry would replace the first, whose target then outlived
    // hostd with its QEMUs.
    if (this.entries.has(base)) return;
    this.entries.set(base, { base, lastFork: 1, ready: null, making: null, again: false });
    this.make(base);
  }

  /**
   * The ready target for a fork of a machine restored from `origin` into `children`, or null
   * (the fork then does the work itself). Call `refill` once the fork is over.
   */
  take(origin: FrozenState | null, children: number): ForkTarget | null {
    const entry = origin ? this.entries.get(origin) : undefined;
    if (!entry) return null;
    entry.lastFork = children;
    return this.takeImage(origin);
  }

  /**
   * The ready target for a capture that starts no machine (a snapshot), if at most `maxWaiting`
   * machines wait in it: the request is spared copying the base image, the largest part of its
   * time and the one that varies with the host's disk, but the waiting machines are bound to
   * that copy and go with it, so a wide fork's target is left to the next fork. The width of
   * the next target stays that of the last fork. Call `refill` once the capture is over.
   */
  takeImage(origin: FrozenState | null, maxWaiting = Infinity): ForkTarget | null {
    const entry = origin ? this.entries.get(origin) : undefined;
    const target = entry?.ready;
    if (!entry || !target || target.incoming > maxWaiting) return null;
    entry.ready = null;
    return target;
  }

  /**
   * Makes no target until `resume`; registering goes on. hostd's start holds the standby while
   * it collects what earlier runs left in the images folder: a spare copy being made then is
   * no state anyone holds yet, and would be deleted under the copy.
   */
  hold(): void {
    this.held = true;
  }

  /** Ends a `hold`: starts making the targets of every registered state. */
  resume(): void {
    this.held = false;
    this.refill();
  }

  /** Starts making the targets that forks took. */
  refill(): void {
    for (const base of this.entries.keys()) this.make(base);
  }

  /**
   * `refill`, `afterForkMs` after a fork ended rather than as it answers: the refill copies an
   * image and starts as many QEMUs as the fork had children (~20 ms of hostd's CPU and ~22 ms of
   * QEMU's each, a fork of 32's refill ~0.6 s of hostd's alone), on a host whose cores the
   * children need then, for their first exec, which usually comes at once (as the pool waits
   * after a create, core/pool.ts). Counted in `filling` meanwhile: the refill is under way.
   */
  refillAfterFork(): void {
    if (this.closed || this.refillTimer) return;
    this.refillTimer = setTimeout(() => {
      this.refillTimer = null;
      this.refill();
    }, this.afterForkMs);
    this.refillTimer.unref();
  }

  /** Incoming machines in ready targets, over all templates (a metric). */
  get vms(): number {
    let n = 0;
    for (const e of this.entries.values()) n += e.ready?.incoming ?? 0;
    return n;
  }

  /**
   * True while a target or its machines are being made, or a refill is scheduled to make them
   * (the benchmark waits for the end).
   */
  get filling(): boolean {
    return this.refillTimer !== null || [...this.entries.values()].some((e) => e.making !== null);
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.refillTimer ?? undefined);
    this.refillTimer = null;
    await Promise.all([...this.entries.values()].map((e) => e.making));
    const ready = [...this.entries.values()].flatMap((e) => (e.ready ? [e.ready] : []));
    for (const e of this.entries.values()) e.ready = null;
    await Promise.all(ready.map((t) => t.discard()));
  }

  private make(base: FrozenState): void {
    const entry = this.entries.get(base);
    if (!entry || this.closed || this.held || entry.ready) return;
    if (entry.making) {
      entry.again = true;
      return;
    }
    entry.making = this.fill(entry)
      // A speed-up that failed: the next fork does the work itself, and the log says why.
      .catch((err: unknown) => this.onFailure(err))
      .finally(() => {
        entry.making = null;
        if (entry.again) {
          entry.again = false;
          this.make(base);
        }
      });
  }

  private async fill(entry: Entry): Promise<void> {
    if (this.shortage(0, this.hypervisor.forkTargetCostMib(entry.base))) return;
    const target = await this.hypervisor.prepareForkTarget(entry.base);
    if (this.closed) {
      await target.discard();
      return;
    }
    entry.ready = target;
    const want = Math.min(this.maxStandby, entry.lastFork);
    while (
      target.incoming < want &&
      entry.ready === target &&
      !this.closed &&
      !this.shortage(1, 0)
    ) {
      await target.addIncoming(); // a failure ends the fill; the image copy is still worth having
    }
  }
}
