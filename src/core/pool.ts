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
    /** Warm the files path too (`warm`): off unless the operator trades memory for it. */
    private readonly warmFiles = false,
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
        await warm(machine, this.warmFiles).catch(async (err: unknown) => {
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

/**
 * The hidden file the files warm-up writes, reads, stats and removes: in /tmp, where the files a
 * sandbox's first uploads mostly go (the same overlay, directory and code paths), named so that no
 * user file can be it. The machine is not anyone's yet, so no listing can see it.
 */
export const WARM_FILE = '/tmp/.hostd-pool-warm-up';
/** A small upload's size (the bench's): two pieces through the port, as the real ones. */
const WARM_FILE_BYTES = 4096;
const WARM_FILES_TIMEOUT_MS = 30_000;

/**
 * Warms a restored machine before it joins the pool: its exec path (Machine.warmUp), then its
 * files path. A restored VM is a new QEMU process whose TCG translations start empty, so a new
 * sandbox's first small PUTs cost about twice the vCPU time of later ones (docs/architecture.md,
 * "Where a small file operation and a pause spend their time"). One round trip of each file
 * operation a user calls first (upload, replace, download, stat, list, remove) pays that here,
 * off the request path; the file is removed, so the sandbox shows nothing of it. Under KVM there
 * is nothing to translate and it is a few sub-millisecond round trips per refill. The files part
 * runs only when `warmFiles` says so (SERVICE_POOL_WARM_FILES): under TCG it leaves ~8 MiB of
 * translations and guest pages in every idle pool machine, which a sandbox that never touches its
 * files would pay for nothing (docs/operations.md).
 */
export async function warm(machine: Machine, warmFiles: boolean): Promise<void> {
  await machine.warmUp();
  if (!warmFiles) return;
  const signal = AbortSignal.timeout(WARM_FILES_TIMEOUT_MS);
  const files = machine.files;
  const content = Buffer.alloc(WARM_FILE_BYTES, 0x2e);
  // Twice: a new file first, then a replacement (a later upload's rename over the old one).
  for (let i = 0; i < 2; i++) {
    const upload = files.writeFile(WARM_FILE, { mode: 0o600, signal });
    upload.sink.end(content);
    await upload.done;
  }
  const download = await files.readFile(WARM_FILE, { signal });
  // Drained: a download's whole path, its bytes included.
  await Promise.all([download.stream.toArray(), download.done]);
  await files.stat(WARM_FILE, { signal });
  await files.list('/tmp', { signal });
  await files.remove(WARM_FILE, { signal });
}

const pause = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms).unref());
