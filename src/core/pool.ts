/**
 * A template's warm pool: the template's frozen state plus machines already restored from it,
 * so a create is a hand-over (about a millisecond) rather than a restore (about a hundred).
 * Refills run one restore at a time so that a burst of creates cannot starve running sandboxes
 * of CPU, and wait while the host is short of memory.
 */
import type { Logger } from 'pino';
import { fail } from '../errors.js';
import type {
  FrozenState,
  Hypervisor,
  Machine,
  MachineShape,
  TemplateImage,
} from '../vm/machine.js';

export interface PoolConfig extends MachineShape {
  readonly name: string;
  readonly poolSize: number;
}

export interface PoolStats {
  template: string;
  ready: number;
  target: number;
}

/**
 * How long a refill waits: after a create took a machine, and before asking again after a
 * failure or while the host is short.
 */
export interface RefillPauses {
  afterTakeMs: number;
  afterFailureMs: number;
  whileShortMs: number;
}

export class TemplatePool {
  private readonly ready: Machine[] = [];
  private frozen: FrozenState | null = null;
  private refilling: Promise<void> | null = null;
  private closed = false;
  /** Milliseconds the template took to boot and freeze (reported by the benchmark). */
  bootMs = 0;

  constructor(
    readonly config: PoolConfig,
    /** The template's built image, which its VMs boot. */
    private readonly image: TemplateImage,
    private readonly hypervisor: Hypervisor,
    private readonly log: Logger,
    /** Why the host cannot afford another VM now, or null; refills wait while it says no. */
    private readonly shortage: () => string | null,
    /** Called for every machine that failed to start (metrics). */
    private readonly onStartFailure: () => void = () => undefined,
    private readonly pauses: RefillPauses = {
      afterTakeMs: 300,
      afterFailureMs: 1000,
      whileShortMs: 2000,
    },
  ) {}

  /** The state every sandbox of this template is a restore of; null before `init`. */
  get state(): FrozenState | null {
    return this.frozen;
  }

  /** Boots the template once and freezes it, then starts filling the pool. */
  async init(): Promise<FrozenState> {
    const started = Date.now();
    this.frozen = await this.hypervisor.bootTemplate(this.config.name, this.config, this.image);
    this.bootMs = Date.now() - started;
    this.log.info(
      { template: this.config.name, bootMs: this.bootMs },
      'template booted and frozen',
    );
    this.refill();
    return this.frozen;
  }

  stats(): PoolStats {
    return { template: this.config.name, ready: this.ready.length, target: this.config.poolSize };
  }

  /** A ready machine: from the pool when one waits (hit), else a fresh restore (miss). */
  async take(): Promise<{ machine: Machine; hit: boolean }> {
    for (;;) {
      const machine = this.ready.shift();
      if (!machine) break;
      machine.onDeath(null);
      if (machine.alive) {
        // A create is mostly followed by its first exec at once. A refill (a restore and its
        // warm-up) started now would run beside it on a small host and slow it down
        // (docs/architecture.md, "Measured choices in the code"): it waits a moment instead.
        setTimeout(() => this.refill(), this.pauses.afterTakeMs).unref();
        return { machine, hit: true };
      }
      void machine.destroy();
    }
    const machine = await this.restore();
    this.refill();
    return { machine, hit: false };
  }

  /** Destroys pooled machines and lets go of the template state. Sandboxes keep theirs. */
  async close(): Promise<void> {
    this.closed = true;
    // A restore in flight must end (and be destroyed) before hostd exits, or its VM outlives it.
    await this.refilling;
    await Promise.all(this.ready.splice(0).map((m) => m.destroy()));
    this.frozen?.release();
    this.frozen = null;
  }

  private async restore(): Promise<Machine> {
    if (!this.frozen) throw fail('templateUnavailable', this.config.name, 'it is not booted');
    try {
      return await this.hypervisor.restore(this.frozen);
    } catch (err) {
      this.onStartFailure();
      throw err;
    }
  }

  private refill(): void {
    if (this.refilling || this.closed) return;
    this.refilling = this.fill().finally(() => (this.refilling = null));
  }

  private async fill(): Promise<void> {
    while (!this.closed && this.ready.length < this.config.poolSize) {
      const short = this.shortage();
      if (short) {
        this.log.warn(
          { template: this.config.name, why: short },
          'pool refill waits for resources',
        );
        await pause(this.pauses.whileShortMs);
        continue;
      }
      let machine: Machine;
      try {
        machine = await this.restore();
        await machine.warmUp(this.image.preload).catch(async (err: unknown) => {
          await machine.destroy();
          throw err;
        });
      } catch (err) {
        this.log.error({ err, template: this.config.name }, 'pool refill failed; retrying');
        await pause(this.pauses.afterFailureMs);
        continue;
      }
      if (this.closed) {
        await machine.destroy();
        return;
      }
      machine.onDeath((why) => {
        this.log.warn({ vm: machine.id, why }, 'pooled VM died; replacing it');
        const i = this.ready.indexOf(machine);
        if (i >= 0) this.ready.splice(i, 1);
        void machine.destroy();
        this.refill();
      });
      this.ready.push(machine);
    }
  }
}

const pause = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms).unref());
