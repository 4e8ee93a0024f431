/**
 * A template's warm pool: the template snapshot plus VMs already restored from it, so a create
 * is a hand-over (about a millisecond) rather than a restore (about a hundred). Refills run one
 * restore at a time so that a burst of creates cannot starve running sandboxes of CPU.
 */
import type { Logger } from 'pino';
import type { TemplateConfig } from '../config.js';
import { fail } from '../errors.js';
import type { MachineSpec } from '../vm/qemu-args.js';
import { Vm, type Snapshot, type VmHost } from '../vm/vm.js';

export interface PoolStats {
  template: string;
  ready: number;
  target: number;
}

export class TemplatePool {
  private readonly ready: Vm[] = [];
  private snapshot: Snapshot | null = null;
  private refilling = false;
  private closed = false;
  /** Milliseconds the template took to cold-boot (reported by the benchmark). */
  bootMs = 0;

  constructor(
    readonly config: TemplateConfig,
    private readonly host: VmHost,
    private readonly spec: MachineSpec,
    private readonly memPath: string,
    private readonly log: Logger,
    /** Called for every VM start failure (metrics). */
    private readonly onStartFailure: () => void = () => undefined,
    /** Why the host cannot afford another VM now, or null; refills wait while it says no. */
    private readonly shortage: () => string | null = () => null,
  ) {}

  /** Cold-boots the template once and freezes it; every sandbox is a restore of this. */
  async init(): Promise<void> {
    const started = Date.now();
    const vm = await Vm.bootTemplate(this.host, this.spec, this.memPath);
    this.snapshot = await vm.freezeAsTemplate(this.memPath);
    this.host.spares?.register(this.host, this.memPath, this.spec);
    this.bootMs = Date.now() - started;
    this.log.info(
      {
        template: this.config.name,
        bootMs: this.bootMs,
        deviceStateBytes: this.snapshot.deviceState.length,
      },
      'template booted and frozen',
    );
    this.refill();
  }

  stats(): PoolStats {
    return { template: this.config.name, ready: this.ready.length, target: this.config.poolSize };
  }

  /** A ready VM: from the pool when one waits (hit), else a fresh restore (miss). */
  async take(): Promise<{ vm: Vm; hit: boolean }> {
    for (;;) {
      const vm = this.ready.shift();
      if (!vm) break;
      vm.removeAllListeners('died');
      if (vm.alive) {
        // Refill after the caller's response is written: spawning QEMU costs milliseconds of
        // CPU that the hand-over should not wait for.
        setImmediate(() => this.refill());
        return { vm, hit: true };
      }
      void vm.destroy();
    }
    const vm = await this.restore();
    this.refill();
    return { vm, hit: false };
  }

  /** A fresh restore of the template snapshot (used by take on a miss). */
  private async restore(): Promise<Vm> {
    if (!this.snapshot) {
      throw fail(
        'templateUnavailable',
        this.config.name,
        'its snapshot is gone (hostd is stopping)',
      );
    }
    try {
      return await Vm.restore(this.host, this.snapshot);
    } catch (err) {
      this.onStartFailure();
      throw err;
    }
  }

  private refill(): void {
    if (this.refilling || this.closed) return;
    this.refilling = true;
    void (async () => {
      try {
        while (!this.closed && this.ready.length < this.config.poolSize) {
          const short = this.shortage();
          if (short) {
            this.log.warn(
              { template: this.config.name, why: short },
              'pool refill waits for resources',
            );
            await new Promise((r) => setTimeout(r, 2000));
            continue;
          }
          let vm: Vm;
          try {
            vm = await this.restore();
            await vm.warmUp().catch(async (err: unknown) => {
              await vm.destroy();
              throw err;
            });
          } catch (err) {
            this.log.error(
              { err, template: this.config.name },
              'pool refill failed; retrying in 1 s',
            );
            await new Promise((r) => setTimeout(r, 1000));
            continue;
          }
          if (this.closed) {
            await vm.destroy();
            return;
          }
          vm.once('died', (why: string) => {
            this.log.warn({ vm: vm.id, why }, 'pooled VM died; replacing it');
            const i = this.ready.indexOf(vm);
            if (i >= 0) this.ready.splice(i, 1);
            void vm.destroy();
            this.refill();
          });
          this.ready.push(vm);
        }
      } finally {
        this.refilling = false;
      }
    })();
  }

  /** Destroys pooled VMs and the template image. Sandboxes already handed out are not touched. */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.all(this.ready.splice(0).map((vm) => vm.destroy()));
    // The image goes once the sandboxes still restored from it are gone too.
    this.snapshot?.image.release();
    this.snapshot = null;
  }
}
