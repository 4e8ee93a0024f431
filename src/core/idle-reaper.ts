/**
 * Frees what nobody uses: a sandbox idle for `idleTimeoutS` is paused or deleted (an agent that
 * forgets a sandbox must not hold a VM forever), and a sandbox paused for `pausedTtlS` is
 * deleted (nor its disk). A sandbox that is running something is never idle, and neither is
 * one with a lifetime (core/lifetimes.ts): its owner said how long it runs.
 */
import type { Sandbox } from './sandbox.js';

export interface ReaperActions {
  /** A running sandbox nobody used for the idle timeout. */
  idle(sandbox: Sandbox): Promise<void>;
  /** A paused sandbox past its time to live. */
  expired(sandbox: Sandbox): Promise<void>;
  /** `idle` or `expired` failed; the sweep goes on with the next sandbox. */
  failed(sandbox: Sandbox, err: unknown): void;
}

export class IdleReaper {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly idleTimeoutS: number,
    private readonly pausedTtlS: number,
    private readonly sandboxes: () => Sandbox[],
    private readonly actions: ReaperActions,
  ) {}

  /** Checks every half of the shorter period (at most every 30 s); 0 disables either. */
  start(): void {
    const periods = [this.idleTimeoutS, this.pausedTtlS].filter((s) => s > 0);
    if (periods.length === 0) return;
    const every = Math.min(30_000, Math.min(...periods) * 500);
    this.timer = setInterval(() => void this.sweep(), every);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** Handles every sandbox idle or expired at `now`; returns how many. */
  async sweep(now = Date.now()): Promise<number> {
    let handled = 0;
    for (const s of this.sandboxes()) {
      if (s.queue.running || s.brokenReason) continue;
      const expired =
        s.paused &&
        this.pausedTtlS > 0 &&
        (s.pausedAt?.getTime() ?? now) < now - this.pausedTtlS * 1000;
      const idle =
        !s.paused &&
        s.lifetime === null &&
        this.idleTimeoutS > 0 &&
        s.lastUsedAt < now - this.idleTimeoutS * 1000;
      if (!expired && !idle) continue;
      await (expired ? this.actions.expired(s) : this.actions.idle(s)).catch((err: unknown) =>
        this.actions.failed(s, err),
      );
      handled++;
    }
    return handled;
  }
}
