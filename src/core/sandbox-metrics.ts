/**
 * A short history of what each running sandbox uses: CPU, memory and disk, sampled every 5 s on
 * the wall clock's 5 s marks from what the machine tells cheaply (its hypervisor process's CPU
 * time and resident memory, its disk's allocated bytes: vm/machine.ts `usage`), kept for the
 * last 30 minutes. The E2B front serves it as `getMetrics()` (docs/e2b.md, Metrics).
 *
 * Host-side figures, not the guest's own: memory is what the VM holds on the host (its QEMU's
 * resident set, at most the guest's RAM), disk what the sandbox wrote to its disk, layers it
 * shares with forks and snapshots included.
 */
import type { Sandbox } from './sandbox.js';

/** One sample of one sandbox. */
export interface SandboxMetric {
  /** Milliseconds since the epoch, on a 5 s mark. */
  readonly timestamp: number;
  readonly cpuCount: number;
  /** CPU used since the previous sample, in percent of all its vCPUs. */
  readonly cpuUsedPct: number;
  readonly memUsedBytes: number;
  readonly memTotalBytes: number;
  readonly diskUsedBytes: number;
  readonly diskTotalBytes: number;
}

/** A sandbox's resources: its template's. */
export interface SandboxShape {
  readonly vcpus: number;
  readonly memoryMib: number;
  readonly diskMib: number;
}

export const METRICS_EVERY_MS = 5_000;
const KEEP_MS = 30 * 60_000;
/**
 * Sandboxes read per turn of the event loop: a round over 100 sandboxes in one turn held the
 * loop for ~2 ms (and for 8 to 19 ms when each read was an `fs.promises` round trip), in the
 * middle of whatever exec's answer was due; 10 at a time take ~0.2 ms each, with the loop free
 * between (docs/architecture.md, "Exec latency on a slow TCG host").
 */
export const SAMPLE_SLICE = 10;

/** The next turn of the event loop, after the I/O that is ready now. */
const nextTurn = (): Promise<void> => new Promise((r) => setImmediate(r));

interface History {
  samples: SandboxMetric[];
  /** The last reading, to take CPU time differences against (per machine: a resume starts over). */
  last: { machine: object; cpuSeconds: number; at: number } | null;
}

export class MetricsSampler {
  private readonly histories = new Map<string, History>();
  private timer: NodeJS.Timeout | undefined;
  private sampling = false;

  constructor(
    private readonly sandboxes: () => Sandbox[],
    private readonly shapeOf: (sandbox: Sandbox) => SandboxShape,
    private readonly now: () => number = Date.now,
  ) {}

  /** Samples on every 5 s mark until `stop`. */
  start(): void {
    const next = (): void => {
      const delay = METRICS_EVERY_MS - (this.now() % METRICS_EVERY_MS);
      this.timer = setTimeout(() => {
        void this.sample().finally(next);
      }, delay);
      this.timer.unref();
    };
    next();
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Forgets a sandbox that is gone. */
  forget(id: string): void {
    this.histories.delete(id);
  }

  /** Samples every running sandbox whose machine can tell its usage. */
  async sample(): Promise<void> {
    if (this.sampling) return; // a slow round (a loaded host) is not stacked on
    this.sampling = true;
    try {
      const at = Math.round(this.now() / 1000) * 1000;
      const all = this.sandboxes();
      for (let i = 0; i < all.length; i += SAMPLE_SLICE) {
        if (i > 0) await nextTurn();
        for (const s of all.slice(i, i + SAMPLE_SLICE)) this.sampleOne(s, at);
      }
    } finally {
      this.sampling = false;
    }
  }

  /** The samples of sandbox `id` taken in [fromMs, toMs], oldest first. */
  samples(id: string, fromMs = -Infinity, toMs = Infinity): SandboxMetric[] {
    const h = this.histories.get(id);
    if (!h) return [];
    return h.samples.filter((m) => m.timestamp >= fromMs && m.timestamp <= toMs);
  }

  private sampleOne(sandbox: Sandbox, at: number): void {
    const { machine } = sandbox;
    if (!machine?.usage || !machine.alive || sandbox.brokenReason) return;
    let usage;
    try {
      usage = machine.usage();
    } catch {
      return; // gone meanwhile
    }
    let h = this.histories.get(sandbox.id);
    if (!h) this.histories.set(sandbox.id, (h = { samples: [], last: null }));
    const shape = this.shapeOf(sandbox);
    const previous = h.last && h.last.machine === machine ? h.last : null;
    const elapsedS = previous ? (at - previous.at) / 1000 : 0;
    const cpuUsedPct =
      previous && elapsedS > 0
        ? clamp(((usage.cpuSeconds - previous.cpuSeconds) / elapsedS / shape.vcpus) * 100, 0, 100)
        : 0;
    h.last = { machine, cpuSeconds: usage.cpuSeconds, at };
    const memTotalBytes = shape.memoryMib * 1024 * 1024;
    h.samples.push({
      timestamp: at,
      cpuCount: shape.vcpus,
      cpuUsedPct: Math.round(cpuUsedPct * 100) / 100,
      memUsedBytes: Math.min(usage.memoryBytes, memTotalBytes),
      memTotalBytes,
      diskUsedBytes: usage.diskBytes,
      diskTotalBytes: shape.diskMib * 1024 * 1024,
    });
    while (h.samples.length > 0 && h.samples[0]!.timestamp < at - KEEP_MS) h.samples.shift();
  }
}

const clamp = (v: number, lo: number, hi: number): number => Math.min(hi, Math.max(lo, v));
